#!/usr/bin/env bash
# System packages the launcher's multi-host tests need: sshd and ssh (a cluster of
# network namespaces, tests/netns_cluster.py) and iproute2 ('ip netns').
# Idempotent and quiet; installs only what is missing; never fails the CI run:
# without root or apt the netns tests skip with a reason instead.
set -u
missing=()
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v ssh >/dev/null 2>&1 && command -v ssh-keygen >/dev/null 2>&1 || missing+=(openssh-client)
[ -x /usr/sbin/sshd ] || command -v sshd >/dev/null 2>&1 || missing+=(openssh-server)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "ci_system_deps: missing ${missing[*]} (need root and apt-get to install); netns launcher tests will skip" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
log="$(mktemp)"
# policy-rc.d 101: install sshd without starting a system-wide daemon (the tests run their own).
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
fi
if apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$log" 2>&1 \
    || { apt-get update -qq >>"$log" 2>&1 && apt-get install -y -qq --no-install-recommends "${missing[@]}" >>"$log" 2>&1; }; then
    :
else
    echo "ci_system_deps: could not install ${missing[*]}; netns launcher tests will skip. apt said:" >&2
    tail -n 5 "$log" >&2
fi
[ "$made_policy" -eq 1 ] && rm -f "$policy"
rm -f "$log"
exit 0
