"""The train / predict / aggregate skeleton every algo asset shares, the interface an asset
implements."""
