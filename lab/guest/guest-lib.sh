# Stage-2 building blocks, sourced by every guest init mode (see README.md). Meant for
# busybox sh, which runs its applets without exec'ing a binary over 9p for each command
# (stage 2 took three times longer with the host's mount and friends). The host tree always
# has busybox: the initramfs was built from it.

# Values of the kernel command line's "dqoes.$1=" arguments, one per line.
cmdline_values() {
    for arg in $(cat /proc/cmdline); do
        case "$arg" in "dqoes.$1="*) echo "${arg#*=}" ;; esac
    done
}

mount_base_filesystems() {
    # busybox sh runs most applets through /proc/self/exe: /proc first, by absolute path.
    /bin/busybox mount -t proc -o nosuid,nodev,noexec proc /proc
    mount -t sysfs -o nosuid,nodev,noexec sysfs /sys
    mount -t devtmpfs -o nosuid,mode=0755 devtmpfs /dev
    mkdir -p /dev/pts /dev/shm
    mount -t devpts -o nosuid,noexec,gid=5,mode=0620,ptmxmode=0666 devpts /dev/pts
    mount -t tmpfs -o nosuid,nodev shm /dev/shm
    mount -t tmpfs -o nosuid,nodev,mode=1777 tmp /tmp
    mount -t tmpfs -o nosuid,nodev,mode=0755 run /run
}

# A pure cgroup v2 hierarchy with every controller the tests use delegated from the root.
mount_cgroup2() {
    mount -t cgroup2 -o nsdelegate,nosuid,nodev,noexec cgroup2 /sys/fs/cgroup
    echo "+cpuset +cpu +io +memory +pids" >/sys/fs/cgroup/cgroup.subtree_control
}

setup_network() {
    hostname dqoes-guest
    ip link set lo up
}

# dqoes.share=TAG:PATH:ro|rw:CACHE, one per extra 9p share (the control share among them).
mount_shares() {
    msize=$(cmdline_values msize)
    for share in $(cmdline_values share); do
        IFS=: read -r tag path mode cache <<SHARE
$share
SHARE
        mkdir -p "$path"
        mount -t 9p -o "$mode,trans=virtio,version=9p2000.L,msize=$msize,cache=$cache" \
            "$tag" "$path"
    done
}

# The job protocol with the host, in the control directory dqoes.ctl=PATH: run job.sh with
# its output in stdout/stderr, touch "started" first (the boot is over) and publish the exit
# status last, atomically, as "exit_code". Meanwhile "heartbeat" is rewritten every
# HEARTBEAT_SECONDS: a guest that stops rewriting it has stopped as a whole.
HEARTBEAT_SECONDS=30
run_job() {
    ctl=$(cmdline_values ctl)
    : >"$ctl/started"
    heartbeat "$ctl" &
    beating=$!
    status=0
    /bin/sh "$ctl/job.sh" </dev/null >"$ctl/stdout" 2>"$ctl/stderr" || status=$?
    kill "$beating" 2>/dev/null || true
    echo "$status" >"$ctl/exit_code.tmp"
    mv "$ctl/exit_code.tmp" "$ctl/exit_code"
}

# The guest's uptime, load and processes but kernel threads (with what each waits for in
# the kernel), for the host to show when the job takes too long.
heartbeat() {
    set +e  # (a background subshell: the init's own set -e stays) a missed beat is no error
    while :; do
        { cat /proc/uptime /proc/loadavg
          /usr/bin/ps --ppid 2 -p 2 --deselect -o pid,ppid,stat,wchan:28,etimes,times,args 2>&1 | cut -c1-240
        } >"$1/heartbeat.tmp"
        mv "$1/heartbeat.tmp" "$1/heartbeat"
        sleep "$HEARTBEAT_SECONDS"
    done
}

# Immediate power-off (busybox's, not systemd's); with qemu's -no-reboot a reboot ends it too.
power_off() {
    sync
    busybox poweroff -f
    busybox reboot -f
}
