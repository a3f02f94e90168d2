# nodegrace %postun ($1: 0 = erase, 1 = upgrade). On upgrade restart into the new binary; it
# takes its logind inhibitor again as it starts, so the gap is one restart.
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload || :
    if [ "$1" -ge 1 ]; then
        systemctl try-restart nodegrace.service ||
            echo "nodegrace: the service did not restart; see: journalctl -u nodegrace" >&2
    else
        systemctl kill --kill-who=main -s HUP systemd-logind.service >/dev/null 2>&1 || :
    fi
fi
exit 0
