#!/usr/bin/env bash
# The programs `make test` needs besides Python packages, installed when missing.
#
#   prometheus     the telemetry tests scrape a real Prometheus (Debian package prometheus)
#   chromium       the dashboard test drives a real headless browser (package chromium)
#   chromedriver   ...through its WebDriver (package chromium-driver)
#
# Missing ones are installed with apt-get (Debian/Ubuntu; through `sudo -n` when not
# root). Without apt-get, or when the install fails, this exits 1 naming the command
# to run: the tests never skip for a missing tool. `--dry-run` prints what it would do.
set -euo pipefail

dry_run=0
if [[ "${1:-}" == "--dry-run" ]]; then dry_run=1; fi

missing=()
for pair in prometheus:prometheus chromium:chromium chromedriver:chromium-driver; do
  binary=${pair%%:*}
  package=${pair#*:}
  command -v "$binary" >/dev/null 2>&1 || missing+=("$package")
done

if ((${#missing[@]} == 0)); then
  echo "[test tools] prometheus, chromium and chromedriver are installed"
  exit 0
fi

sudo=""
if [[ "$(id -u)" != 0 ]]; then sudo="sudo -n "; fi
install="${sudo}apt-get update -qq && ${sudo}env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ${missing[*]}"

if ((dry_run)); then
  echo "[test tools] missing: ${missing[*]}"
  echo "[test tools] would run: $install"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "[test tools] missing ${missing[*]} and this is not a Debian system; install them, then re-run make test" >&2
  exit 1
fi
echo "[test tools] installing ${missing[*]} (apt-get)"
if ! bash -c "$install" >/dev/null; then
  echo "[test tools] could not install ${missing[*]}; run: $install" >&2
  exit 1
fi
