package cm_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/internal/hang"
	"github.com/goverbs/goverbs/internal/rxetest"
)

// helperEnv makes the test binary a peer process that dies without
// closing anything (the kernel then tears its rdma_cm IDs down, as when a
// process is killed): "request:PORT" dies on the connect request, before
// it answers; "established:PORT" dies once the connection is up.
const helperEnv = "GOVERBS_CM_TEST_PEER"

func init() {
	mode, port, ok := strings.Cut(os.Getenv(helperEnv), ":")
	if !ok {
		return
	}
	p, _ := strconv.Atoi(port)
	os.Exit(peer(mode, uint16(p)))
}

func peer(mode string, port uint16) int {
	ctx := context.Background()
	ch, err := cm.Open()
	if err != nil {
		fmt.Println(err)
		return 1
	}
	lis, err := ch.CreateID(cm.TCP)
	if err == nil {
		err = lis.Bind(netip.AddrPortFrom(addr1, port))
	}
	if err == nil {
		err = lis.Listen(1)
	}
	if err != nil {
		fmt.Println(err)
		return 1
	}
	fmt.Println("listening")
	req, err := lis.GetRequest(ctx)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	if mode == "established" {
		if _, err := req.ID.Accept(ctx, cm.ConnParam{QPN: 0x123456}); err != nil {
			fmt.Println(err)
			return 1
		}
	}
	fmt.Println("dying")
	return 0 // os.Exit: no Close, the kernel cleans up
}

// TestPeerKilled: the peer process dies mid-handshake (the client's
// Connect fails with a clear error, bounded) and after the connection is up
// (the client sees DISCONNECTED); no cm_id is left behind.
func TestPeerKilled(t *testing.T) {
	needCM(t)
	rxetest.CheckCMIDs(t)
	for _, mode := range []string{"request", "established"} {
		t.Run(mode, func(t *testing.T) {
			p := port()
			cmd := exec.Command(os.Args[0])
			cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s:%d", helperEnv, mode, p))
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill()
			lines := bufio.NewScanner(out)
			if !lines.Scan() || lines.Text() != "listening" {
				t.Fatalf("peer: %q", lines.Text())
			}
			ctx, cancel := context.WithTimeout(context.Background(), hang.Scale(60*time.Second))
			defer cancel()
			ch := openChannel(t)
			cli, err := ch.CreateID(cm.TCP)
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			if err := cli.ResolveAddr(ctx, addr0, netip.AddrPortFrom(addr1, p)); err != nil {
				t.Fatal(err)
			}
			if err := cli.ResolveRoute(ctx); err != nil {
				t.Fatal(err)
			}
			// No QP of our own: the peer dies before or after answering.
			start := time.Now()
			_, err = cli.Connect(ctx, cm.ConnParam{QPN: 0x654321})
			for lines.Scan() {
			}
			cmd.Wait()
			switch mode {
			case "request":
				if err == nil {
					t.Fatal("connect to a peer that died on the request succeeded")
				}
				var ee *cm.EventError
				if !errors.As(err, &ee) {
					t.Fatalf("connect: %v, want an *EventError", err)
				}
				t.Logf("%v after %v", err, time.Since(start).Round(time.Millisecond))
			case "established":
				if err != nil {
					t.Fatalf("connect: %v", err)
				}
				if err := cli.WaitDisconnect(ctx); err != nil {
					t.Fatalf("after the peer died: %v", err)
				}
				t.Logf("DISCONNECTED %v after connect", time.Since(start).Round(time.Millisecond))
			}
		})
	}
}
