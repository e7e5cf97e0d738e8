package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// The TCP exchange of goverbs perf's bx_* and tcp_* tests, which have no
// perftest counterpart (the perftest tests speak perftest's own exchange,
// perf_xchg.go): JSON objects, one per line.
//
//	client -> server  hello: the test's parameters and its QPs' addresses
//	server            checks the parameters match its own
//	server -> client  hello (or {"error": ...} and both exit 1)
//	both              connect their QPs, then for each message size:
//	both              barrier "start <size>" (receives posted, QPs in RTS)
//	both              run the test
//	both              barrier "end <size>"; the client's end carries its
//	                  results, which a passive server (write_bw, read_*,
//	                  atomic_*) prints as perftest's server does
//
// A barrier is: write {"sync": name}, read the peer's, which must match.

const perfWireVersion = 1

// perfParams are what both sides must agree on.
type perfParams struct {
	Version  int    `json:"version"`
	Test     string `json:"test"`
	Conn     string `json:"conn"`
	Sizes    []int  `json:"sizes"`
	Iters    int    `json:"iters"`
	QPs      int    `json:"qps"`
	PostList int    `json:"post_list"`
	TxDepth  int    `json:"tx_depth"`
	CQMod    int    `json:"cq_mod"`
	Atomic   string `json:"atomic,omitempty"`
}

// perfQPInfo is one QP's address, and where its peer may read and write.
type perfQPInfo struct {
	LID  uint16 `json:"lid"`
	QPN  uint32 `json:"qpn"`
	PSN  uint32 `json:"psn"`
	GID  net.IP `json:"gid"`
	Addr uint64 `json:"addr"`
	RKey uint32 `json:"rkey"`
	MTU  int    `json:"mtu"`
}

type perfMsg struct {
	Params  *perfParams     `json:"params,omitempty"`
	QPs     []perfQPInfo    `json:"qps,omitempty"`
	Sync    string          `json:"sync,omitempty"`
	Results json.RawMessage `json:"results,omitempty"`
	Error   string          `json:"error,omitempty"`
}

type perfConn struct {
	c   net.Conn
	enc *json.Encoder
	dec *json.Decoder
}

func newPerfConn(c net.Conn) *perfConn {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	return &perfConn{c: c, enc: json.NewEncoder(c), dec: json.NewDecoder(bufio.NewReader(c))}
}

func (p *perfConn) Close() error { return p.c.Close() }

func (p *perfConn) send(m perfMsg) error { return p.enc.Encode(m) }

func (p *perfConn) recv() (perfMsg, error) {
	var m perfMsg
	if err := p.dec.Decode(&m); err != nil {
		return m, fmt.Errorf("exchange with the peer: %v", err)
	}
	if m.Error != "" {
		return m, fmt.Errorf("the peer failed: %s", m.Error)
	}
	return m, nil
}

// clientParams is the server's first step: it reads the client's
// parameters and checks them against its own; on a mismatch it tells the
// client why before it returns the error.
func (p *perfConn) clientParams(params perfParams) (perfMsg, error) {
	m, err := p.recv()
	if err != nil {
		return m, err
	}
	if m.Params == nil {
		err = errors.New("the client sent no parameters")
	} else if d := params.mismatch(*m.Params); d != "" {
		err = fmt.Errorf("client and server disagree: %s (server vs client)", d)
	}
	if err != nil {
		p.fail(err)
	}
	return m, err
}

// barrier waits until the peer reaches the barrier of the same name;
// results ride along (the client's, for a passive server to print).
func (p *perfConn) barrier(name string, results json.RawMessage) (json.RawMessage, error) {
	if err := p.send(perfMsg{Sync: name, Results: results}); err != nil {
		return nil, fmt.Errorf("barrier %q: %v", name, err)
	}
	m, err := p.recv()
	if err != nil {
		return nil, fmt.Errorf("barrier %q: %v", name, err)
	}
	if m.Sync != name {
		return nil, fmt.Errorf("barrier %q: the peer is at %q", name, m.Sync)
	}
	return m.Results, nil
}

// fail tells the peer why we give up (best effort).
func (p *perfConn) fail(err error) {
	p.c.SetWriteDeadline(time.Now().Add(time.Second))
	p.send(perfMsg{Error: err.Error()})
}

func perfDial(host string, port int) (*perfConn, error) {
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	var c net.Conn
	var err error
	// perftest retries too: the server may still be setting up.
	for i := 0; i < 50; i++ {
		c, err = net.DialTimeout("tcp", addr, 5*time.Second)
		if err == nil {
			return newPerfConn(c), nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil, fmt.Errorf("couldn't connect to %s: %v", addr, err)
}

func perfListen(port int) (*perfConn, error) {
	l, err := net.Listen("tcp", ":"+strconv.Itoa(port))
	if err != nil {
		return nil, fmt.Errorf("couldn't listen to port %d: %v", port, err)
	}
	defer l.Close()
	c, err := l.Accept()
	if err != nil {
		return nil, fmt.Errorf("accept() failed: %v", err)
	}
	return newPerfConn(c), nil
}

// mismatch lists the parameters in which the two sides differ.
func (a perfParams) mismatch(b perfParams) string {
	var d []string
	add := func(name string, x, y any) {
		if fmt.Sprint(x) != fmt.Sprint(y) {
			d = append(d, fmt.Sprintf("%s %v vs %v", name, x, y))
		}
	}
	add("version", a.Version, b.Version)
	add("test", a.Test, b.Test)
	add("connection (-c)", a.Conn, b.Conn)
	add("sizes (-s/-a)", a.Sizes, b.Sizes)
	add("iterations (-n)", a.Iters, b.Iters)
	add("QPs (-q)", a.QPs, b.QPs)
	add("post list (-l)", a.PostList, b.PostList)
	add("atomic type (-A)", a.Atomic, b.Atomic)
	return strings.Join(d, ", ")
}
