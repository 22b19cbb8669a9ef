#!/usr/bin/env bash
# The real browser the dashboard's tests drive (tests/browser): Debian's headless Chromium and its
# WebDriver, installed from apt (CI runs this as root, before the tests). Nothing is fetched at
# test time: Selenium is pointed at /usr/bin/chromium and /usr/bin/chromedriver.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    echo "browser: $(chromium --version 2>/dev/null | head -n 1), chromedriver present"
    exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
    echo "browser: not root, so chromium and chromium-driver are not installed and tests/browser will skip"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
echo "browser: $(chromium --version 2>/dev/null | head -n 1) installed"
