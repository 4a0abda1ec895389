"""Code shared by the Substra assets and the scripts of the DP-SGD MNIST bundle.

Modules are small and import only numpy (plus dp_accounting for privacy, substra for plans), so a
function archive can carry exactly the ones its asset imports (see ``mnist_dp.archive``).
"""
