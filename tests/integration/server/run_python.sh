#!/bin/sh
# Runs a server test script with the project's virtualenv (.venv, made by scripts/setup.sh) when it exists, else python3.
root=$(cd "$(dirname "$0")/../../.." && pwd)
if [ -x "$root/.venv/bin/python" ]; then py="$root/.venv/bin/python"; else py=python3; fi
exec "$py" "$@"
