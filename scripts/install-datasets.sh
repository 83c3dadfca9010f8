#!/usr/bin/env bash
# Install Debian's Fashion-MNIST package when we can (root + apt), then say what lmckit will
# actually use — asked of lmckit itself (argument 1: its Python), so the message matches
# the demo. Never fails the setup: every lmckit job also runs on bundled data.
set -u
python=${1:-python3}
target=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}  # overridable for tests
if [ -d "$target" ] && ls "$target"/*idx* >/dev/null 2>&1; then
  echo "Fashion-MNIST: found in $target"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "Fashion-MNIST: installing Debian package dataset-fashion-mnist ..."
  log=$(mktemp)
  if apt-get install -y -q dataset-fashion-mnist >"$log" 2>&1 ||
     { apt-get update -q >>"$log" 2>&1 && apt-get install -y -q dataset-fashion-mnist >>"$log" 2>&1; }; then
    echo "Fashion-MNIST: installed in $target"
  else
    echo "Fashion-MNIST: apt-get could not install dataset-fashion-mnist; it said:"
    grep -E '^(E|W):|rror' "$log" | tail -n 5 | sed 's/^/  /'
    [ -s "$log" ] && ! grep -qE '^(E|W):|rror' "$log" && tail -n 5 "$log" | sed 's/^/  /'
  fi
  rm -f "$log"
else
  echo "Fashion-MNIST: not root or no apt-get; cannot install dataset-fashion-mnist"
fi
if "$python" -c 'import sys; from lmckit.data import fashion_mnist_available as f; sys.exit(0 if f() else 1)' 2>/dev/null; then
  echo "Fashion-MNIST: lmckit finds it; the demo runs on it."
else
  echo "Fashion-MNIST: lmckit does not find it; the demo falls back to scikit-learn's bundled 8x8 digits."
fi
exit 0
