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

# pingpong_usec NAME PORT ITERS SIZE CMD...: one pair of CMD, a ping-pong
# with ibv_rc_pingpong's flags (goverbs rc-pingpong or rdma-core's), in
# the guest: the server on rxe1, the client on rxe0 (10.99.0.2), -g 1.
# Prints the client's usec/iter; NAME prefixes its errors.
pingpong_usec() {
	local name=$1 port=$2 iters=$3 size=$4 spid out
	shift 4
	timeout 300 "$@" -d rxe1 -g 1 -p "$port" -n "$iters" -s "$size" >/dev/null 2>&1 &
	spid=$!
	wait_listen "$port" "$spid" || { echo "$name: server did not listen" >&2; return 1; }
	out=$(timeout 300 "$@" -d rxe0 -g 1 -p "$port" -n "$iters" -s "$size" 10.99.0.2 2>&1) ||
		{ echo "$name: client failed: $out" >&2; return 1; }
	wait "$spid" || { echo "$name: server failed" >&2; return 1; }
	sed -n 's/^[0-9]* iters in [0-9.]* seconds = \([0-9.]*\) usec\/iter$/\1/p' <<<"$out"
}

# tcg_godebug: the GODEBUG for Go processes on this CPU: under qemu's TCG
# (model name "QEMU TCG CPU") the runtime's AVX turned off, as the
# runtime's AVX copies can make the emulated CPU's later float arithmetic
# many times slower, by the binary's layout (docs/evaluation.md,
# "Thirty-sixth session"); nothing elsewhere.
tcg_godebug() {
	if grep -qs 'QEMU TCG' /proc/cpuinfo; then
		echo cpu.avx=off,cpu.avx2=off
	fi
}
