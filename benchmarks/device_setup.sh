# Source on the device machine: installs the carried wheels (.whl) and points tests at the
# carried photos (.devdata); wheels too large for .whl (PyAV) may be carried in .devdata/wheels. Usage: . benchmarks/device_setup.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl $(ls .devdata/wheels/*.whl 2>/dev/null)
export PYTHONPATH=/tmp/site:$PWD
export MAPSTREAM_SHARED=$PWD/.devdata
export PYTHONUNBUFFERED=1
