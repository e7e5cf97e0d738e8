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
