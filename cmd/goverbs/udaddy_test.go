package main

import (
	"testing"
)

// TestUdaddyInterop runs goverbs udaddy against rdma-core's udaddy
// (rdmacm-utils) both ways and against itself: a SIDR exchange on the UDP
// port space (port 7174, fixed in udaddy), then 10 datagrams each way.
func TestUdaddyInterop(t *testing.T) {
	cmInterop(t, "udaddy", "server", "client", func(t *testing.T, _ int, server, client string, run peerRun) {
		srvRes, srvDone := run(server, "-b", "10.99.0.2", "-C", "10", "-S", "100")
		waitCMListen(t, "10.99.0.2", udaddyPort, srvDone)
		cliRes, _ := run(client, "-s", "10.99.0.2", "-b", "10.99.0.1", "-C", "10", "-S", "100")
		rc, rs := cliRes(), srvRes()
		checkCMRun(t, client+" client", rc)
		checkCMRun(t, server+" server", rs)
	})
}
