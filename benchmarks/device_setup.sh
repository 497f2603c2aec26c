# Source on the device machine: installs the carried wheels (.whl) and points tests at the
# carried photos (.devdata). Usage: . benchmarks/device_setup.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
export MAPSTREAM_SHARED=$PWD/.devdata
export PYTHONUNBUFFERED=1
