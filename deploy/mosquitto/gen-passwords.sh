#!/bin/sh
# Create the Mosquitto password file for the broker user and one user per edge site.
#
#   deploy/mosquitto/gen-passwords.sh OUT_PASSWD_FILE SITE [SITE ...]
#
# Each password is random (32 hex chars) and printed once as `user password`
# on stdout, for the operator to put in the broker's config
# (SKYFED_MQTT__PASSWORD) and each agent's environment (SKYFED_EDGE_PASSWORD).
# Re-running replaces the file. The site name must equal the agent's --site.
set -eu
if [ "$#" -lt 2 ]; then
    echo "usage: $0 OUT_PASSWD_FILE SITE [SITE ...]" >&2
    exit 2
fi
out="$1"; shift
command -v mosquitto_passwd >/dev/null || { echo "mosquitto_passwd not found" >&2; exit 1; }
umask 077
tmp="$(mktemp)"
: > "$tmp"
for user in skyfed-broker "$@"; do
    case "$user" in
        */*|*+*|*#*|"") echo "invalid site name: '$user'" >&2; rm -f "$tmp"; exit 2 ;;
    esac
    pw="$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
    mosquitto_passwd -b "$tmp" "$user" "$pw"
    echo "$user $pw"
done
mv "$tmp" "$out"
