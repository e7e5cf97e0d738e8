package bx_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goverbs/goverbs/bx"
	"github.com/goverbs/goverbs/internal/hang"
)

// fill writes a pattern of seed into b, so that a response shows whose
// bytes it carries.
func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7)
	}
}

// TestReply checks responses built in place with Msg.Reply, on an inline
// handler and on the worker pool: the whole buffer, a prefix, a slice that
// is not the reply (copied, the reply buffer goes back), a second Reply,
// an error after Reply, a Reply too large, rendezvous sizes (a prefix that
// fits an eager message is copied into one), and that no buffer is left
// behind on either allocator.
func TestReply(t *testing.T) {
	const eager = 8192 - bx.HeaderSize
	srv, _, p, _ := pair(t, nil)
	var outside struct {
		sync.Mutex
		m *bx.Msg
	}
	// The request names the case: "mode size keep".
	h := func(_ context.Context, _ *bx.Peer, req *bx.Msg) ([]byte, error) {
		var mode string
		var size, keep int
		if _, err := fmt.Sscan(string(req.Data()), &mode, &size, &keep); err != nil {
			return nil, err
		}
		b, err := req.Reply(size)
		if err != nil {
			return nil, err
		}
		if len(b) != size || cap(b) != size {
			return nil, fmt.Errorf("Reply(%d) gave len %d cap %d", size, len(b), cap(b))
		}
		fill(b, 1)
		switch mode {
		case "full":
			return b, nil
		case "prefix":
			return b[:keep], nil
		case "other":
			o := make([]byte, keep)
			fill(o, 2)
			return o, nil
		case "twice":
			b2, err := req.Reply(keep)
			if err != nil {
				return nil, err
			}
			fill(b2, 3)
			return b2, nil
		case "grown":
			// append past the reply's capacity moves the bytes: copied.
			return append(b, 0xee), nil
		case "error":
			return b, errors.New("refused after Reply")
		case "keep":
			outside.Lock()
			outside.m = req
			outside.Unlock()
			return b, nil
		}
		return nil, fmt.Errorf("unknown mode %q", mode)
	}
	srv.HandleInline(1, h)
	srv.Handle(2, h)
	ctx, wd := hang.For(t, "calls", 2*time.Minute) // a hang bound (no progress), not a speed bound
	defer wd.Stop()

	eager0, _, rndv0 := srv.AllocatorStats()
	want := func(n int, seed byte) []byte {
		b := make([]byte, n)
		fill(b, seed)
		return b
	}
	grown := append(want(100, 1), 0xee)
	cases := []struct {
		req  string
		want []byte
	}{
		{"full 64 0", want(64, 1)},
		{"full 0 0", []byte{}},
		{"full 4096 0", want(4096, 1)},
		{fmt.Sprintf("full %d 0", eager), want(eager, 1)},
		{"prefix 4096 10", want(10, 1)},
		{"prefix 4096 0", []byte{}},
		{"other 64 300", want(300, 2)},
		{"twice 64 200", want(200, 3)},
		{"grown 100 0", grown},
		{"keep 64 0", want(64, 1)},
		{"full 65536 0", want(65536, 1)},                                        // rendezvous
		{fmt.Sprintf("prefix 65536 %d", eager+1), want(eager+1, 1)},             // still rendezvous
		{"prefix 65536 64", want(64, 1)},                                        // copied into an eager message
		{fmt.Sprintf("twice %d 64", eager+100), want(64, 3)},                    // rendezvous reply given back
		{fmt.Sprintf("other %d %d", eager+100, eager+5), want(eager+5, 2)},      // copied, reply given back
		{fmt.Sprintf("prefix %d %d", eager+100, eager+100), want(eager+100, 1)}, // the whole of it
	}
	for _, stream := range []uint32{1, 2} {
		for _, c := range cases {
			m, err := p.Call(ctx, stream, []byte(c.req))
			if err != nil {
				t.Fatalf("stream %d %q: %v", stream, c.req, hang.Cause(ctx, err))
			}
			if !bytes.Equal(m.Data(), c.want) {
				t.Errorf("stream %d %q: %d bytes %x..., want %d bytes %x...", stream, c.req,
					len(m.Data()), head(m.Data()), len(c.want), head(c.want))
			}
			m.Release()
			wd.Progress()
		}
		// An error after Reply is the caller's RemoteError; the reply goes back.
		if _, err := p.Call(ctx, stream, []byte("error 64 0")); !bx.IsRemote(err) || !strings.Contains(err.Error(), "refused after Reply") {
			t.Errorf("stream %d: error after Reply: %v", stream, err)
		}
		// Beyond MaxMessage: Reply's error names the size.
		if _, err := p.Call(ctx, stream, []byte("full 5000000 0")); !bx.IsRemote(err) || !strings.Contains(err.Error(), "Reply of 5000000 bytes") {
			t.Errorf("stream %d: Reply beyond MaxMessage: %v", stream, err)
		}
		if _, err := p.Call(ctx, stream, []byte("full -1 0")); !bx.IsRemote(err) || !strings.Contains(err.Error(), "Reply of -1 bytes") {
			t.Errorf("stream %d: Reply(-1): %v", stream, err)
		}
	}
	// Outside its handler Reply fails, and so does a received response's.
	outside.Lock()
	kept := outside.m
	outside.Unlock()
	if _, err := kept.Reply(8); err == nil || !strings.Contains(err.Error(), "outside the handler") {
		t.Errorf("Reply after the handler returned: %v", err)
	}
	m, err := p.Call(ctx, 1, []byte("full 8 0"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Reply(8); err == nil || !strings.Contains(err.Error(), "outside the handler") {
		t.Errorf("Reply on a response: %v", err)
	}
	m.Release()
	var nilMsg *bx.Msg
	if _, err := nilMsg.Reply(1); err == nil {
		t.Error("Reply on a nil Msg succeeded")
	}
	// Every reply buffer went back: the server's allocators hold what
	// they held before, once the client acknowledged the responses.
	var eager1, rndv1 int64
	for range 2000 { // a hang bound: acknowledgements come within a tick or two
		e, _, r := srv.AllocatorStats()
		eager1, rndv1 = e.InUse, r.InUse
		if eager1 == eager0.InUse && rndv1 == rndv0.InUse {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if eager1 != eager0.InUse || rndv1 != rndv0.InUse {
		t.Errorf("server buffers in use: eager %d, rendezvous %d; before the calls %d, %d", eager1, rndv1, eager0.InUse, rndv0.InUse)
	}
}

func head(b []byte) []byte { return b[:min(len(b), 8)] }
