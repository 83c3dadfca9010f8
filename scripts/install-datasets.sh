#!/usr/bin/env bash
# Install Debian's Fashion-MNIST package when we can (root + apt); otherwise say what lmckit
# will fall back to. Never fails the setup: every lmckit job also runs on bundled data.
set -u
target=/usr/share/datasets/fashion-mnist
if [ -d "$target" ] && ls "$target"/*idx* >/dev/null 2>&1; then
  echo "Fashion-MNIST: found in $target"
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "Fashion-MNIST: installing Debian package dataset-fashion-mnist ..."
  if (apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1; }); then
    echo "Fashion-MNIST: installed in $target"
    exit 0
  fi
  echo "Fashion-MNIST: apt-get could not install dataset-fashion-mnist"
else
  echo "Fashion-MNIST: not root or no apt-get; cannot install dataset-fashion-mnist"
fi
echo "Fashion-MNIST is unavailable: lmckit falls back to scikit-learn's bundled 8x8 digits."
exit 0
