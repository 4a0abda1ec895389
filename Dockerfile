# The bundle's environment; the default command runs the test suite.
#   docker build -t mnist-dp . && docker run --rm mnist-dp
FROM python:3.11.7-slim-bookworm
# CPU-only torch (PyPI's torch==2.13.0 is the multi-GB CUDA build); protobuf's pure-Python
# implementation lets TensorFlow and MindSpore share a process (DESIGN.md).
ENV PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu \
    PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python \
    PYTHONUNBUFFERED=1
WORKDIR /bundle
COPY requirements.txt requirements-dev.txt ./
RUN pip install --no-cache-dir -r requirements-dev.txt
COPY . .
CMD ["python", "-m", "pytest", "tests"]
