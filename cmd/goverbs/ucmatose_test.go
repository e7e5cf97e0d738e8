package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/rxetest"
)

// TestUcmatoseInterop runs goverbs ucmatose against rdma-core's ucmatose
// (rdmacm-utils) both ways and against itself with ucmatose's defaults
// (port 7471, 10 messages of 100 bytes each way): both sides must finish
// the transfers and the disconnect, and a goverbs side reports what it
// received.
func TestUcmatoseInterop(t *testing.T) {
	rxetest.Pair(t)
	tose := lookTool(t, "ucmatose", "rdmacm-utils")
	for _, pair := range []struct{ server, client string }{
		{"ucmatose", "goverbs"}, {"goverbs", "ucmatose"}, {"goverbs", "goverbs"},
	} {
		t.Run(fmt.Sprintf("%s-server/%s-client", pair.server, pair.client), func(t *testing.T) {
			run := peerStarter(t, tose, "ucmatose")
			start := time.Now()
			srvRes, srvDone := run(pair.server, "-b", "10.99.0.2")
			waitCMListen(t, "10.99.0.2", ucmatosePort, srvDone)
			cliRes, _ := run(pair.client, "-s", "10.99.0.2", "-b", "10.99.0.1")
			rc, rs := cliRes(), srvRes()
			t.Logf("%.1f s", time.Since(start).Seconds())
			for _, x := range []struct {
				who, want string
				r         result
			}{{pair.client + " client", "sending replies", rc}, {pair.server + " server", "disconnected", rs}} {
				if x.r.code != 0 || x.r.err != nil || !strings.Contains(x.r.stdout, x.want) ||
					!strings.Contains(x.r.stdout, "data transfers complete") || !strings.Contains(x.r.stdout, "return status 0") {
					t.Errorf("%s: exit %d (%v)\nstdout:\n%s\nstderr:\n%s", x.who, x.r.code, x.r.err, x.r.stdout, x.r.stderr)
				}
				if strings.HasPrefix(x.who, "goverbs") && !strings.Contains(x.r.stdout, "cmatose: received 10 messages of 100 bytes") {
					t.Errorf("%s's report:\n%s", x.who, x.r.stdout)
				}
			}
		})
	}
}

func TestUcmatoseUsage(t *testing.T) {
	checkUsageErrors(t, [][]string{
		{"ucmatose", "-c", "2"}, {"ucmatose", "-P", "ib"}, {"ucmatose", "-t", "0x10"},
		{"ucmatose", "-C", "-1"}, {"ucmatose", "-p", "0"},
	})
}
