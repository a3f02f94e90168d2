# nodegrace %post ($1: 1 = install, 2 = upgrade). Enable and start on install; an upgrade is
# restarted from %postun once the new files are in place.
install -d -m 0700 /var/lib/nodegrace
install -d -m 0755 /etc/nodegrace/config.d
if [ "$1" -eq 1 ]; then
    systemctl enable nodegrace.service >/dev/null 2>&1 || :
fi
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload || :
    # logind reads logind.conf.d only when told; pick up the packaged drop-in now.
    systemctl kill --kill-who=main -s HUP systemd-logind.service >/dev/null 2>&1 || :
    if [ "$1" -eq 1 ]; then
        systemctl start nodegrace.service ||
            echo "nodegrace: the service did not start; see: journalctl -u nodegrace" >&2
    fi
fi
exit 0
