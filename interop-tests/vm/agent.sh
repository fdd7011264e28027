#!/bin/sh
# Control agent of the rxe VM, on a serial port of its own (no kernel messages there). Line
# protocol, host → VM, one request per line, answered in order:
#   S <id> <base64 script>   spawn the script in a new session; answer "@@F <id> SPAWNED"
#   P <id> <ms>              wait up to <ms> for job <id>; answer "@@F <id> RUNNING", or
#                            "@@F <id> OUT", base64 stdout, "@@F <id> ERR", base64 stderr,
#                            "@@F <id> END <status>" and forget the job
#   K <id> <signal>          signal the job's process group; answer "@@F <id> KILLED"
#   X 0                      power off
# Jobs write to files, never to this port, so their output cannot interleave with the protocol.
#
# Waiting forks nothing: a job's end is announced on a FIFO the agent holds open (fd 3) and P
# blocks in the shell's own `read -t`. Polling with `usleep` cost a fork and exec every 20 ms,
# ~15 % of the VM's one CPU under TCG (perf in the guest), taken from whatever was measured.
tty="$1"
status="$2"
J=/run/ferroce-jobs
mkdir -p "$J"
rm -f "$J/.ended"
mkfifo "$J/.ended"
# Read-write, so opening does not wait for a writer and the FIFO never reports end of file.
exec 3<>"$J/.ended"
# Microseconds since the epoch, by parameter expansion only (no fork).
now_us() { us=${EPOCHREALTIME/./}; }
stty -F "$tty" raw -echo 2>/dev/null
exec <"$tty" >"$tty" 2>/dev/console
say() { printf '@@F %s\n' "$*"; }
say "- READY $status"
while IFS= read -r line; do
    set -- $line
    op="$1" id="$2" arg="$3"
    case "$id" in *[!0-9]*|"") say "- BAD $op"; continue ;; esac
    case "$op" in
    S)
        printf '%s' "$arg" | base64 -d >"$J/$id.sh"
        # The job's runner is started by a subshell that ends at once and is waited for here,
        # so it is not the agent's child: its end sends the agent no SIGCHLD. ash catches that
        # signal without SA_RESTART, and one arriving while `say` wrote to the port cut the
        # line: an answer lost now and then under load (an OUT line, or a RUNNING the harness
        # then waited a minute for).
        (
            (
                # Not a process-group leader, so setsid does not fork: the pid is the session id.
                setsid sh -c '. /etc/ferroce-preamble; . "$0"' "$J/$id.sh" \
                    </dev/null >"$J/$id.out" 2>"$J/$id.err" 3>&- &
                echo $! >"$J/$id.pid"
                wait $!
                echo $? >"$J/$id.rc.tmp"
                mv "$J/$id.rc.tmp" "$J/$id.rc"
                echo "$id" >&3
            ) &
        )
        say "$id SPAWNED"
        ;;
    P)
        # Lines of jobs already collected are drained here (and any line only wakes the loop
        # to look again), so the FIFO's buffer never fills.
        while read -t 0.001 _ <&3; do :; done
        now_us
        end=$((us + arg * 1000))
        while [ ! -e "$J/$id.rc" ]; do
            now_us
            left=$((end - us))
            [ "$left" -gt 0 ] || break
            frac=$((left % 1000000 + 1000000))
            read -t "$((left / 1000000)).${frac#1}" _ <&3
        done
        if [ -e "$J/$id.rc" ]; then
            say "$id OUT"
            base64 <"$J/$id.out"
            say "$id ERR"
            base64 <"$J/$id.err"
            say "$id END $(cat "$J/$id.rc")"
            rm -f "$J/$id".*
        elif [ -e "$J/$id.sh" ]; then
            say "$id RUNNING"
        else
            say "$id UNKNOWN"
        fi
        ;;
    K)
        n=0
        while [ ! -e "$J/$id.pid" ] && [ "$n" -lt 50 ]; do usleep 20000; n=$((n + 1)); done
        [ -e "$J/$id.pid" ] && kill -s "$arg" "-$(cat "$J/$id.pid")" 2>/dev/null
        say "$id KILLED"
        ;;
    X)
        say "- POWEROFF"
        sync
        poweroff -f
        ;;
    *)
        say "- BAD $op"
        ;;
    esac
done
