# Sourced by the *_vs_transformers.sh benches: where WHEELS names a folder of cp312 wheels
# (transformers, compressed-tensors and the pure-Python packages they need), installs them
# beside the machine's torch and puts them on PYTHONPATH.
if [ -n "${WHEELS:-}" ]; then
    pip install -q --no-deps --no-index --target /tmp/pyx "$WHEELS"/*.whl
    export PYTHONPATH=/tmp/pyx
fi
