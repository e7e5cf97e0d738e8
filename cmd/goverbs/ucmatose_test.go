package main

import (
	"testing"
	"time"
)

// TestUcmatoseInterop runs goverbs ucmatose against rdma-core's ucmatose
// (rdmacm-utils) both ways and against itself with ucmatose's defaults
// (port 7471, 10 messages of 100 bytes each way): both sides must finish
// the transfers and the disconnect, and a goverbs side reports what it
// received.
func TestUcmatoseInterop(t *testing.T) {
	cmInterop(t, "ucmatose", "server", "client", func(t *testing.T, _ int, server, client string, run peerRun) {
		start := time.Now()
		srvRes, srvDone := run(server, "-b", "10.99.0.2")
		waitCMListen(t, "10.99.0.2", ucmatosePort, srvDone)
		cliRes, _ := run(client, "-s", "10.99.0.2", "-b", "10.99.0.1")
		rc, rs := cliRes(), srvRes()
		t.Logf("%.1f s", time.Since(start).Seconds())
		// A goverbs side also reports what it received.
		want := func(who, w string) []string {
			if who == "goverbs" {
				return []string{w, "cmatose: received 10 messages of 100 bytes"}
			}
			return []string{w}
		}
		checkCMRun(t, client+" client", rc, want(client, "sending replies")...)
		checkCMRun(t, server+" server", rs, want(server, "disconnected")...)
	})
}

func TestUcmatoseUsage(t *testing.T) {
	checkUsageErrors(t, [][]string{
		{"ucmatose", "-c", "2"}, {"ucmatose", "-P", "ib"}, {"ucmatose", "-t", "0x10"},
		{"ucmatose", "-C", "-1"}, {"ucmatose", "-p", "0"},
	})
}
