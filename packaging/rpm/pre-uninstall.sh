# nodegrace %preun ($1: 0 = erase, 1 = upgrade). On erase stop without draining: a plain stop
# does not drain (the daemon drains from its stop path only while the system shuts down).
if [ "$1" -eq 0 ]; then
    if [ -d /run/systemd/system ]; then
        systemctl stop nodegrace.service || :
    fi
    systemctl disable nodegrace.service >/dev/null 2>&1 || :
fi
exit 0
