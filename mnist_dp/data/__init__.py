"""MNIST-format data: its sources, the dataset folders generate_data writes, the data samples a task
reads."""
