# The bundle's environment (every framework, substra, the tests); the default command runs the test suite.
#   docker build -t mnist-dp . && docker run --rm mnist-dp
# Inside it no Docker daemon answers, so the docker-mode tests skip, each saying so in one line.
FROM python:3.11.7-slim-bookworm
# CPU-only torch (PyPI's torch==2.13.0 is the multi-GB CUDA build); protobuf's pure-Python
# implementation lets TensorFlow and MindSpore share one process.
ENV PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu \
    PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python \
    PYTHONUNBUFFERED=1
# libgomp1: MindSpore's CPU kernels; libgl1, libglib2.0-0: OpenCV's cv2, which MindArmour imports.
RUN apt-get update && apt-get install -y --no-install-recommends libgomp1 libgl1 libglib2.0-0 \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /bundle
COPY requirements.txt requirements-dev.txt pyproject.toml ./
# requirements.txt installs this project in editable mode: its package folder must exist (its code
# comes with the last COPY, so a code change does not invalidate the pip layer).
COPY mnist_dp/__init__.py mnist_dp/
# MindSpore's wheel carries GPU and Ascend plugins (1.8 GB) that a CPU never loads.
RUN pip install --no-cache-dir -r requirements-dev.txt \
    && rm -rf /usr/local/lib/python3.11/site-packages/mindspore/lib/plugin/gpu* \
              /usr/local/lib/python3.11/site-packages/mindspore/lib/plugin/*ascend* \
              /usr/local/lib/python3.11/site-packages/mindspore/lib/plugin/libmindspore_gpu*
COPY . .
CMD ["python", "-m", "pytest", "tests"]
