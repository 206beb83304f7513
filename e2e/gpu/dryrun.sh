#!/usr/bin/env bash
# Runs the GPU-machine check (check.sh --dry-run) from the unpacked bundle over each
# driver-root layout, so the check cannot rot unseen (make gpu-dry-run, part of make test).
# Needs root (runc, mknod).
#
#   e2e/gpu/dryrun.sh BUNDLE.tar.gz LAYOUT...
#
# Environment: DRIVER_VERSION (e2e/harness/driverroot/build.sh's default when unset).
set -euo pipefail

bundle=${1:?usage: dryrun.sh BUNDLE.tar.gz LAYOUT...}
shift
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/nvinject-gpu-dry.XXXXXX)
trap 'rm -rf "$work"' EXIT
tar -C "$work" -xzf "$bundle"
failed=()
for layout in "$@"; do
	rc=0
	root=$(DRIVER_LAYOUT=$layout "$here/../harness/driverroot/build.sh" | tail -1) || rc=$?
	if ((rc == 3)); then
		# Debian's archive is unreachable and the packages are not cached: no real root.
		echo "gpu-dry-run: $layout SKIP (no real driver root: Debian's archive is unreachable)"
		continue
	fi
	((rc == 0)) || { echo "gpu-dry-run: building the $layout driver root failed (exit $rc)" >&2; exit 1; }
	start=$SECONDS
	if "$work/nvinject-gpu/check.sh" --dry-run --driver-root "$root" --watch 4 --work "$work/check" > "$work/$layout.log" 2>&1; then
		echo "gpu-dry-run: $layout PASS ($((SECONDS - start))s)"
	else
		cat "$work/$layout.log"
		echo "gpu-dry-run: $layout FAIL ($((SECONDS - start))s, output above)"
		failed+=("$layout")
	fi
done
((${#failed[@]} == 0)) || { echo "gpu-dry-run: failed on ${failed[*]}" >&2; exit 1; }
