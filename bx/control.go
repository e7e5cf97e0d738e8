package bx

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// The control plane is one TCP connection per pair of endpoints: mutual
// challenge-response authentication with a pre-shared token (the token never
// crosses the wire), then the exchange of QP numbers, GIDs and credit
// grants, then recovery requests for as long as the peers talk.

// Control message types.
const (
	ctlHello   = 1 // server: nonce
	ctlAuth    = 2 // client: nonce, MAC
	ctlAuthOK  = 3 // server: MAC
	ctlSetup   = 4 // both: endpoint id, GID, lanes, grant
	ctlRecover = 5 // dialer: new lanes of a new epoch, next expected sequence per lane
	ctlRecAck  = 6 // acceptor: its new lanes, next expected sequence per lane
	ctlBye     = 7 // close; body: the reason, if not an orderly Close (maxReason bytes at most)
	ctlFail    = 8 // the other side refuses (no reason is given before authentication)
	ctlPing    = 9 // liveness
	// acceptor, rdma_cm lanes (Config.LaneSetup): its new lanes of a
	// recovery epoch are accepted and its windows bound; a setup naming
	// the epoch
	ctlLanesUp = 10
)

const (
	nonceSize = 32
	macSize   = sha256.Size
	// maxCtl bounds a control message: a peer cannot make us allocate more.
	// A recovery setup with maxGrants windows is the largest.
	maxCtl = 64 << 10
	// maxGrants bounds the transfers in progress a recovery setup names.
	maxGrants = 4096
	// maxGrant bounds the credits a peer may grant (and Config.Credits).
	maxGrant = 1 << 20
	// maxLanes bounds the QPs a peer may ask for.
	maxLanes = 16
	// maxReason bounds the reason a bye carries.
	maxReason = 512
)

// ctlMsg is a decoded control message.
type ctlMsg struct {
	Type   uint8
	Reason string // ctlBye: why the peer closed ("" for an orderly Close)
	Nonce  []byte
	MAC    []byte
	Setup  setup
	// Version is the wire version a hello or an auth names (wireVersion);
	// 0 where the peer's bx predates the field (wire version 6 or older).
	Version uint8
}

// lane is one QP's connection data.
type laneInfo struct {
	QPN  uint32
	PSN  uint32
	Next uint64 // next sequence number the sender of this message expects on the lane
	// Acked is the highest sequence it delivered: Next-1 but for messages
	// it holds, received but waiting for an earlier rendezvous to finish.
	// The peer resends from Next and frees up to Acked.
	Acked uint64
}

// setup describes one side's end of a connection.
type setup struct {
	ID    uint64 // endpoint incarnation: a restarted peer has a new one
	Epoch uint32
	GID   [16]byte
	Grant uint64 // cumulative receive credits granted to the peer (control reserve included)
	// Consumed is, in recovery, how many of those the peer's messages used.
	Consumed uint64
	Lanes    []laneInfo
	// Grants are, in recovery, the new windows of transfers still waiting
	// for their FIN (grant.go).
	Grants []regrant
	// CM is set when the lanes are set up through rdma_cm (cmlane.go).
	CM *cmSetup
	// Eager is the largest payload this side receives in a message of
	// its own (its Config.EagerSize: the size of its receive buffers);
	// 0 in a recovery's failure notice.
	Eager uint32
}

func writeCtl(c net.Conn, typ uint8, body []byte, deadline time.Duration) error {
	if len(body)+1 > maxCtl {
		return fmt.Errorf("bx: control message of %d bytes", len(body))
	}
	b := make([]byte, 4+1+len(body))
	binary.LittleEndian.PutUint32(b, uint32(1+len(body)))
	b[4] = typ
	copy(b[5:], body)
	if deadline > 0 {
		c.SetWriteDeadline(time.Now().Add(deadline))
		defer c.SetWriteDeadline(time.Time{})
	}
	_, err := c.Write(b)
	return err
}

func readCtl(c net.Conn, deadline time.Duration) (ctlMsg, error) {
	if deadline > 0 {
		c.SetReadDeadline(time.Now().Add(deadline))
		defer c.SetReadDeadline(time.Time{})
	}
	var lb [4]byte
	if _, err := io.ReadFull(c, lb[:]); err != nil {
		return ctlMsg{}, err
	}
	n := binary.LittleEndian.Uint32(lb[:])
	if n == 0 || n > maxCtl {
		return ctlMsg{}, fmt.Errorf("bx: control message of %d bytes outside 1..%d", n, maxCtl)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(c, b); err != nil {
		return ctlMsg{}, err
	}
	return decodeCtl(b)
}

// decodeCtl parses one control message (type byte and body). It is what a
// peer, authenticated or not, controls: every length is checked.
func decodeCtl(b []byte) (ctlMsg, error) {
	if len(b) == 0 {
		return ctlMsg{}, errors.New("bx: empty control message")
	}
	m := ctlMsg{Type: b[0]}
	body := b[1:]
	switch m.Type {
	case ctlHello:
		// The nonce, then the wire version (none before version 7).
		switch len(body) {
		case nonceSize + 1:
			m.Version = body[nonceSize]
		case nonceSize:
		default:
			return m, fmt.Errorf("bx: hello of %d bytes", len(body))
		}
		m.Nonce = body[:nonceSize]
	case ctlAuth:
		// The nonce and MAC, then the wire version (none before 7).
		switch len(body) {
		case nonceSize + macSize + 1:
			m.Version = body[nonceSize+macSize]
		case nonceSize + macSize:
		default:
			return m, fmt.Errorf("bx: auth of %d bytes", len(body))
		}
		m.Nonce, m.MAC = body[:nonceSize], body[nonceSize:nonceSize+macSize]
	case ctlAuthOK:
		if len(body) != macSize {
			return m, fmt.Errorf("bx: auth ok of %d bytes", len(body))
		}
		m.MAC = body
	case ctlSetup, ctlRecover, ctlRecAck, ctlLanesUp:
		s, err := decodeSetup(body)
		if err != nil {
			return m, err
		}
		m.Setup = s
	case ctlBye:
		if len(body) > maxReason {
			return m, fmt.Errorf("bx: bye with a reason of %d bytes", len(body))
		}
		m.Reason = sanitizeReason(body)
	case ctlFail, ctlPing:
		if len(body) != 0 {
			return m, fmt.Errorf("bx: control message %d with %d body bytes", m.Type, len(body))
		}
	default:
		return m, fmt.Errorf("bx: unknown control message type %d", m.Type)
	}
	return m, nil
}

const setupFixed = 8 + 4 + 16 + 8 + 8 + 1 + 4
const laneSize = 4 + 4 + 8 + 8
const regrantSize = 1 + 8 + 4

func (s *setup) encode() []byte {
	g := setupFixed + laneSize*len(s.Lanes)
	b := make([]byte, g+2+regrantSize*len(s.Grants))
	binary.LittleEndian.PutUint16(b[g:], uint16(len(s.Grants)))
	for i, r := range s.Grants {
		o := g + 2 + i*regrantSize
		b[o] = r.Lane
		binary.LittleEndian.PutUint64(b[o+1:], r.Ref)
		binary.LittleEndian.PutUint32(b[o+9:], r.RKey)
	}
	binary.LittleEndian.PutUint64(b[0:], s.ID)
	binary.LittleEndian.PutUint32(b[8:], s.Epoch)
	copy(b[12:28], s.GID[:])
	binary.LittleEndian.PutUint64(b[28:], s.Grant)
	binary.LittleEndian.PutUint64(b[36:], s.Consumed)
	b[44] = uint8(len(s.Lanes))
	binary.LittleEndian.PutUint32(b[45:], s.Eager)
	for i, l := range s.Lanes {
		o := setupFixed + i*laneSize
		binary.LittleEndian.PutUint32(b[o:], l.QPN)
		binary.LittleEndian.PutUint32(b[o+4:], l.PSN)
		binary.LittleEndian.PutUint64(b[o+8:], l.Next)
		binary.LittleEndian.PutUint64(b[o+16:], l.Acked)
	}
	if s.CM != nil {
		b = append(b, s.CM.encode()...)
	}
	return b
}

func decodeSetup(b []byte) (setup, error) {
	var s setup
	if len(b) < setupFixed {
		return s, fmt.Errorf("bx: setup of %d bytes", len(b))
	}
	s.ID = binary.LittleEndian.Uint64(b[0:])
	s.Epoch = binary.LittleEndian.Uint32(b[8:])
	copy(s.GID[:], b[12:28])
	s.Grant = binary.LittleEndian.Uint64(b[28:])
	s.Consumed = binary.LittleEndian.Uint64(b[36:])
	if s.Consumed > s.Grant {
		return s, fmt.Errorf("bx: setup says %d of %d credits consumed", s.Consumed, s.Grant)
	}
	s.Eager = binary.LittleEndian.Uint32(b[45:])
	if s.Eager != 0 && !eagerSizeOK(int(s.Eager)) {
		return s, fmt.Errorf("bx: setup with eager size %d outside 64..1 MiB-header", s.Eager)
	}
	n := int(b[44])
	if n == 0 || n > maxLanes {
		return s, fmt.Errorf("bx: setup with %d lanes outside 1..%d", n, maxLanes)
	}
	g := setupFixed + n*laneSize
	if len(b) < g+2 {
		return s, fmt.Errorf("bx: setup of %d bytes for %d lanes", len(b), n)
	}
	ng := int(binary.LittleEndian.Uint16(b[g:]))
	if ng > maxGrants {
		return s, fmt.Errorf("bx: setup with %d windows of transfers in progress, more than %d", ng, maxGrants)
	}
	if end := g + 2 + ng*regrantSize; len(b) == end+cmSetupSize {
		c, err := decodeCMSetup(b[end:])
		if err != nil {
			return s, err
		}
		s.CM, b = c, b[:end]
	}
	if len(b) != g+2+ng*regrantSize {
		return s, fmt.Errorf("bx: setup of %d bytes for %d lanes and %d windows", len(b), n, ng)
	}
	if ng > 0 {
		s.Grants = make([]regrant, ng)
	}
	for i := range s.Grants {
		o := g + 2 + i*regrantSize
		s.Grants[i] = regrant{Lane: b[o], Ref: binary.LittleEndian.Uint64(b[o+1:]), RKey: binary.LittleEndian.Uint32(b[o+9:])}
		if int(s.Grants[i].Lane) >= n {
			return s, fmt.Errorf("bx: setup names a window on lane %d of %d", s.Grants[i].Lane, n)
		}
	}
	s.Lanes = make([]laneInfo, n)
	for i := range s.Lanes {
		o := setupFixed + i*laneSize
		s.Lanes[i] = laneInfo{
			QPN:   binary.LittleEndian.Uint32(b[o:]) & 0xffffff,
			PSN:   binary.LittleEndian.Uint32(b[o+4:]) & 0xffffff,
			Next:  binary.LittleEndian.Uint64(b[o+8:]),
			Acked: binary.LittleEndian.Uint64(b[o+16:]),
		}
		if l := s.Lanes[i]; l.Next != 0 && l.Acked >= l.Next || l.Next == 0 && l.Acked != 0 {
			return s, fmt.Errorf("bx: setup lane %d acknowledges %d but expects %d next", i, l.Acked, l.Next)
		}
	}
	return s, nil
}

// ErrAuth is returned when the peer does not prove it holds the token.
var ErrAuth = errors.New("bx: peer failed authentication")

func mac(token []byte, role string, serverNonce, clientNonce []byte) []byte {
	h := hmac.New(sha256.New, token)
	h.Write([]byte(role))
	h.Write(serverNonce)
	h.Write(clientNonce)
	return h.Sum(nil)
}

func nonce() []byte {
	b := make([]byte, nonceSize)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return b
}

// authServer runs the accepting side of the handshake. The hello and the
// auth name each side's wire version: ends of different versions refuse
// each other here, before any QP is made, with an error that names both
// (a bye tells the other side why).
func authServer(c net.Conn, token []byte, d time.Duration) error {
	sn := nonce()
	if err := writeCtl(c, ctlHello, append(sn, wireVersion), d); err != nil {
		return err
	}
	m, err := readCtl(c, d)
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		// What a bx of wire version 6 or older does with our hello.
		return fmt.Errorf("bx: the dialer hung up after our hello (a bx older than wire version %d does, or a dialer that is not bx): %w", wireVersion, err)
	}
	if err != nil {
		return err
	}
	if m.Type == ctlBye {
		return refused(m)
	}
	if m.Type != ctlAuth {
		return fmt.Errorf("bx: expected auth, got control message %d", m.Type)
	}
	if !hmac.Equal(m.MAC, mac(token, "bx client", sn, m.Nonce)) {
		writeCtl(c, ctlFail, nil, d)
		return ErrAuth
	}
	if err := refuseVersion(c, m.Version, false, d); err != nil {
		return err
	}
	return writeCtl(c, ctlAuthOK, mac(token, "bx server", sn, m.Nonce), d)
}

// authClient runs the dialing side: it also checks that the server holds
// the token, so a client never sends its QP data to an impostor.
func authClient(c net.Conn, token []byte, d time.Duration) error {
	m, err := readCtl(c, d)
	if _, isTLS := c.(*tls.Conn); err != nil && !isTLS {
		return fmt.Errorf("bx: no challenge from the peer (does it require TLS, Config.TLS?): %w", err)
	}
	if err != nil {
		return tlsRefused(c, err)
	}
	if m.Type != ctlHello {
		return fmt.Errorf("bx: expected hello, got control message %d", m.Type)
	}
	if err := refuseVersion(c, m.Version, true, d); err != nil {
		return err
	}
	cn := nonce()
	body := append(append(append([]byte(nil), cn...), mac(token, "bx client", m.Nonce, cn)...), wireVersion)
	if err := writeCtl(c, ctlAuth, body, d); err != nil {
		return err
	}
	r, err := readCtl(c, d)
	if err != nil {
		return tlsRefused(c, err)
	}
	if r.Type == ctlFail {
		return ErrAuth
	}
	if r.Type == ctlBye {
		return refused(r)
	}
	if r.Type != ctlAuthOK || !hmac.Equal(r.MAC, mac(token, "bx server", m.Nonce, cn)) {
		return ErrAuth
	}
	return nil
}

// refuseVersion is nil for a peer of our wire version. For one of another
// (peer 0: older than 7, which has no version in its hello or auth) it
// tells the peer why in a bye and returns ErrProtocol saying the same.
func refuseVersion(c net.Conn, peer uint8, dialer bool, d time.Duration) error {
	if peer == wireVersion {
		return nil
	}
	theirs := fmt.Sprint(peer)
	if peer == 0 {
		theirs = "6 or older"
	}
	acc, dial := fmt.Sprint(wireVersion), theirs
	if dialer {
		acc, dial = dial, acc
	}
	why := fmt.Sprintf("the acceptor's bx speaks wire version %s, the dialer's %s: both ends must run the same bx wire version", acc, dial)
	writeCtl(c, ctlBye, []byte(why), d)
	return fmt.Errorf("%w: %s", ErrProtocol, why)
}

// refused is the error for a bye that ends the other side's part of the
// authentication (refuseVersion).
func refused(bye ctlMsg) error {
	return fmt.Errorf("%w: the peer refused the handshake: %s", ErrProtocol, bye.Reason)
}

// ErrTLS is returned when the TLS session of the control connection
// cannot be set up: a certificate the other side does not accept, or a
// peer that does not speak TLS (Config.TLS on one side only).
var ErrTLS = errors.New("bx: TLS handshake of the control connection failed")

// checkServerTLS reports why Config.TLS cannot accept peers.
func (e *Endpoint) checkServerTLS() error {
	t := e.cfg.TLS
	if t == nil {
		return nil
	}
	if len(t.Certificates) == 0 && t.GetCertificate == nil && t.GetConfigForClient == nil {
		return errors.New("bx: Config.TLS has no certificate to accept peers with (Certificates or GetCertificate)")
	}
	return nil
}

// secureClient runs the dialer's TLS handshake on the control connection
// c when Config.TLS is set; it closes c if that fails.
func (e *Endpoint) secureClient(ctx context.Context, c net.Conn, addr string) (net.Conn, error) {
	if e.cfg.TLS == nil {
		return c, nil
	}
	cfg := e.cfg.TLS.Clone()
	if cfg.ServerName == "" {
		if host, _, err := net.SplitHostPort(addr); err == nil {
			cfg.ServerName = host
		}
	}
	tc := tls.Client(c, cfg)
	if err := handshakeTLS(ctx, tc, e.cfg.HandshakeTimeout); err != nil {
		c.Close()
		return nil, err
	}
	return tc, nil
}

// secureServer is secureClient for an accepted connection.
func (e *Endpoint) secureServer(ctx context.Context, c net.Conn) (net.Conn, error) {
	if e.cfg.TLS == nil {
		return c, nil
	}
	tc := tls.Server(c, e.cfg.TLS)
	if err := handshakeTLS(ctx, tc, e.cfg.HandshakeTimeout); err != nil {
		c.Close()
		return nil, err
	}
	return tc, nil
}

func handshakeTLS(ctx context.Context, tc *tls.Conn, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		var rh tls.RecordHeaderError
		if errors.As(err, &rh) {
			return fmt.Errorf("%w: the peer does not speak TLS (is Config.TLS set on both ends?): %w", ErrTLS, err)
		}
		return fmt.Errorf("%w: %w", ErrTLS, err)
	}
	return nil
}

// tlsRefused names the likely cause of a control connection that fails
// right after a TLS handshake: with TLS 1.3 the server checks the
// client's certificate after the client's handshake is done, so its
// refusal reaches the client as an alert on the first read.
func tlsRefused(c net.Conn, err error) error {
	if _, ok := c.(*tls.Conn); !ok || err == nil {
		return err
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "remote error" {
		return fmt.Errorf("%w: the peer refused the session (our certificate?): %w", ErrTLS, err)
	}
	return err
}

// byeReason is what a bye tells the peer of why (an error of ours): empty
// for an orderly Close, else the error's text, cut at maxReason bytes.
func byeReason(why error) []byte {
	if why == nil || errors.Is(why, ErrClosed) {
		return nil
	}
	r := why.Error()
	if len(r) > maxReason {
		r = r[:maxReason]
	}
	return []byte(r)
}

// sanitizeReason makes a peer's reason safe to print: printable ASCII
// only, anything else as '?'.
func sanitizeReason(b []byte) string {
	r := make([]byte, len(b))
	for i, c := range b {
		if c < 0x20 || c > 0x7e {
			c = '?'
		}
		r[i] = c
	}
	return string(r)
}
