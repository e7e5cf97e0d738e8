# scripts/lib.sh: shell functions the scripts share. Source it:
#   . "$here/lib.sh"

# wait_listen PORT PID: wait until something listens on TCP port PORT
# (up to 30 s, or 60 s with WAIT_LISTEN_TRIES=1200); fail at once if
# process PID (the server started for it) is gone.
wait_listen() {
	local i
	for ((i = 0; i < ${WAIT_LISTEN_TRIES:-600}; i++)); do
		ss -Hltn "sport = :$1" | grep -q . && return 0
		kill -0 "$2" 2>/dev/null || return 1
		sleep 0.05
	done
	return 1
}
