#!/usr/bin/env bash
# The report tests load report.html in a real headless browser: Debian's chromium, driven
# by Playwright (a dev dependency). Install chromium when we can (root + apt); the browser
# tests say so and skip when it is missing. Never fails the setup.
set -u
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "chromium: installing the Debian package for the browser tests ..."
  if (apt-get install -y -q chromium >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; }); then
    echo "chromium: installed"
    exit 0
  fi
  echo "chromium: apt-get could not install it; the browser tests will be skipped"
else
  echo "chromium: not root or no apt-get; the browser tests will be skipped"
fi
exit 0
