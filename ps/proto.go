package ps

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"unsafe"
)

// The wire protocol. Every message is little endian and self-delimiting
// only through its carrier (a bx message, or one TCP frame), so the decoder
// checks that the lengths it reads add up to exactly the bytes it got.
//
// Request:
//
//	u8 version (1) | u8 op | u8 flags (0) | u8 name length | name
//	OpPull:      u32 dim | u32 n | n x u64 key
//	OpPush:      u32 dim | u32 n | n x u64 key | n*dim x f32 gradient
//	OpPullDense: u32 size
//	OpPushDense: u32 size | size x f32 gradient
//	OpDefine:    u8 kind | u8 optimizer | u16 0 | u32 dim | u64 rows or size |
//	             f32 lr | f32 eps | f32 initial accumulator | u64 seed
//	OpStats:     nothing (name empty)
//
// Response:
//
//	u8 status (0 ok, 1 error) | u8 error code | u16 0 | u64 server incarnation
//	ok, OpPull:      u32 dim | u32 n | n*dim x f32
//	ok, OpPullDense: u32 size | size x f32
//	ok, OpPush*:     u32 rows applied | u32 rows skipped (NaN, skip policy)
//	ok, OpDefine:    nothing
//	ok, OpStats:     u64 user CPU ns | u64 system CPU ns | u64 requests | u64 errors
//	error:           u16 length | message

// Op is a request type.
type Op uint8

// Operations.
const (
	OpPull      Op = 1
	OpPush      Op = 2
	OpPullDense Op = 3
	OpPushDense Op = 4
	OpDefine    Op = 5
	OpStats     Op = 6
)

func (o Op) String() string {
	switch o {
	case OpPull:
		return "pull"
	case OpPush:
		return "push"
	case OpPullDense:
		return "pull-dense"
	case OpPushDense:
		return "push-dense"
	case OpDefine:
		return "define"
	case OpStats:
		return "stats"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

const (
	protoVersion = 1
	// MaxName is the longest parameter name.
	MaxName = 255
	// maxWireKeys bounds n in any request the decoder accepts (16 Mi keys,
	// 128 MiB of keys); servers enforce their own, smaller MaxBatch.
	maxWireKeys = 1 << 24
	// maxWireFloats bounds the floats of one message (256 MiB).
	maxWireFloats = 1 << 26
	respHeader    = 12
)

// ErrMalformed is a request or response that does not decode.
var ErrMalformed = errors.New("ps: malformed message")

// Request is a decoded request. Keys and Floats are views of the message
// bytes (raw little-endian), valid as long as those bytes are.
type Request struct {
	Op   Op
	Name string
	Dim  int    // OpPull, OpPush, OpDefine
	N    int    // keys (OpPull, OpPush) or floats (OpPullDense, OpPushDense)
	name []byte // the name, a view (the server's path: no string made)
	keys []byte // n x u64
	vals []byte // f32s
	Spec Spec   // OpDefine
}

// Key returns the i-th key, or 0 if the request has none at i (i outside
// 0..N-1 of a decoded pull or push; a nil or zero Request has none).
func (r *Request) Key(i int) uint64 {
	if r == nil || uint(i) >= uint(len(r.keys)/8) {
		return 0
	}
	return binary.LittleEndian.Uint64(r.keys[8*i:])
}

// Float returns the i-th gradient value, or 0 if the request has none at
// i (i outside 0..NumFloats()-1; a nil or zero Request has none).
func (r *Request) Float(i int) float32 {
	if r == nil || uint(i) >= uint(len(r.vals)/4) {
		return 0
	}
	return math.Float32frombits(binary.LittleEndian.Uint32(r.vals[4*i:]))
}

// NumFloats is the number of gradient values (0 for a nil Request).
func (r *Request) NumFloats() int {
	if r == nil {
		return 0
	}
	return len(r.vals) / 4
}

func appendHead(b []byte, op Op, name string) []byte {
	return append(append(b, protoVersion, byte(op), 0, byte(len(name))), name...)
}

func headSize(name string) int { return 4 + len(name) }

// pullSize and friends give exact encoded sizes, so a request can be built
// in place in a buffer of the right size (bx.Endpoint.Alloc).
func pullSize(name string, n int) int         { return headSize(name) + 8 + 8*n }
func pushSize(name string, n, dim int) int    { return headSize(name) + 8 + 8*n + 4*n*dim }
func pullDenseSize(name string) int           { return headSize(name) + 4 }
func pushDenseSize(name string, size int) int { return headSize(name) + 4 + 4*size }

// encodePull writes a pull request into b (len pullSize) and returns the
// offset of the keys.
func encodeHead(b []byte, op Op, name string) int {
	b[0], b[1], b[2], b[3] = protoVersion, byte(op), 0, byte(len(name))
	copy(b[4:], name)
	return 4 + len(name)
}

func putKeys(b []byte, keys []uint64) {
	if littleEndian {
		copy(b[:8*len(keys)], unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(keys))), 8*len(keys)))
		return
	}
	for i, k := range keys {
		binary.LittleEndian.PutUint64(b[8*i:], k)
	}
}

// littleEndian: the wire's byte order is the machine's, so floats and
// keys move with one copy (memmove) instead of one conversion per value.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// floatBytes is f's memory as bytes.
func floatBytes(f []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), 4*len(f))
}

func putFloats(b []byte, f []float32) {
	if littleEndian {
		copy(b[:4*len(f)], floatBytes(f))
		return
	}
	for i, v := range f {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
}

func getFloats(dst []float32, b []byte) {
	if littleEndian {
		copy(floatBytes(dst), b[:4*len(dst)])
		return
	}
	_ = b[4*len(dst)-1:]
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
}

// encodeCheck refuses what the wire cannot carry or the decoder would
// refuse: a name over MaxName bytes (its length is one byte), a dim or a
// count outside the wire's bounds (they are 32-bit fields).
func encodeCheck(fn, name string, dim, keys, floats int) error {
	switch {
	case len(name) > MaxName:
		return fmt.Errorf("%w: %s: name of %d bytes, want at most %d", ErrMalformed, fn, len(name), MaxName)
	case dim < 0 || dim > maxWireFloats:
		return fmt.Errorf("%w: %s: dim %d, want 0..%d", ErrMalformed, fn, dim, maxWireFloats)
	case keys > maxWireKeys:
		return fmt.Errorf("%w: %s: %d keys, want at most %d", ErrMalformed, fn, keys, maxWireKeys)
	case floats < 0 || floats > maxWireFloats:
		return fmt.Errorf("%w: %s: %d values, want 0..%d", ErrMalformed, fn, floats, maxWireFloats)
	}
	return nil
}

// EncodePull encodes a sparse pull request (for tests and tools; Client
// builds requests in place). It refuses, with an error wrapping
// ErrMalformed that names the field, a name over MaxName bytes, a
// negative dim or counts over the wire's bounds (the response's
// len(keys)*dim values included).
func EncodePull(name string, dim int, keys []uint64) ([]byte, error) {
	if err := encodeCheck("EncodePull", name, dim, len(keys), 0); err != nil {
		return nil, err
	}
	if len(keys)*dim > maxWireFloats {
		return nil, fmt.Errorf("%w: EncodePull: %d keys of dim %d, a response of more than %d values", ErrMalformed, len(keys), dim, maxWireFloats)
	}
	b := make([]byte, pullSize(name, len(keys)))
	o := encodeHead(b, OpPull, name)
	binary.LittleEndian.PutUint32(b[o:], uint32(dim))
	binary.LittleEndian.PutUint32(b[o+4:], uint32(len(keys)))
	putKeys(b[o+8:], keys)
	return b, nil
}

// EncodePush encodes a sparse push request: dim gradient values per key,
// so len(grads) must be len(keys)*dim. It refuses what EncodePull does,
// and gradients of another count.
func EncodePush(name string, dim int, keys []uint64, grads []float32) ([]byte, error) {
	if err := encodeCheck("EncodePush", name, dim, len(keys), len(grads)); err != nil {
		return nil, err
	}
	if len(grads) != len(keys)*dim {
		return nil, fmt.Errorf("%w: EncodePush: %d gradient values for %d keys of dim %d, want %d", ErrMalformed, len(grads), len(keys), dim, len(keys)*dim)
	}
	b := make([]byte, headSize(name)+8+8*len(keys)+4*len(grads))
	o := encodeHead(b, OpPush, name)
	binary.LittleEndian.PutUint32(b[o:], uint32(dim))
	binary.LittleEndian.PutUint32(b[o+4:], uint32(len(keys)))
	putKeys(b[o+8:], keys)
	putFloats(b[o+8+8*len(keys):], grads)
	return b, nil
}

// EncodePullDense encodes a dense pull request of size values. It
// refuses a name over MaxName bytes and a size outside the wire's bounds.
func EncodePullDense(name string, size int) ([]byte, error) {
	if err := encodeCheck("EncodePullDense", name, 0, 0, size); err != nil {
		return nil, err
	}
	b := make([]byte, pullDenseSize(name))
	o := encodeHead(b, OpPullDense, name)
	binary.LittleEndian.PutUint32(b[o:], uint32(size))
	return b, nil
}

// EncodePushDense encodes a dense push request. It refuses what
// EncodePullDense does.
func EncodePushDense(name string, grads []float32) ([]byte, error) {
	if err := encodeCheck("EncodePushDense", name, 0, 0, len(grads)); err != nil {
		return nil, err
	}
	b := make([]byte, pushDenseSize(name, len(grads)))
	o := encodeHead(b, OpPushDense, name)
	binary.LittleEndian.PutUint32(b[o:], uint32(len(grads)))
	putFloats(b[o+4:], grads)
	return b, nil
}

const defineBody = 1 + 1 + 2 + 4 + 8 + 4 + 4 + 4 + 8

// EncodeDefine encodes a define request. It refuses only what the wire
// cannot carry (a name over MaxName bytes, a Dim or dense Size outside
// the wire's bounds); what it carries, the server checks (Store.Define),
// so a test can send a spec the server refuses.
func EncodeDefine(s Spec) ([]byte, error) {
	size := 0
	if s.Kind == Dense {
		size = s.Size
	}
	if err := encodeCheck("EncodeDefine", s.Name, s.Dim, 0, size); err != nil {
		return nil, err
	}
	b := make([]byte, headSize(s.Name)+defineBody)
	o := encodeHead(b, OpDefine, s.Name)
	b[o], b[o+1] = byte(s.Kind), byte(s.Opt.Kind)
	binary.LittleEndian.PutUint32(b[o+4:], uint32(s.Dim))
	n := s.Rows
	if s.Kind == Dense {
		n = uint64(s.Size)
	}
	binary.LittleEndian.PutUint64(b[o+8:], n)
	binary.LittleEndian.PutUint32(b[o+16:], math.Float32bits(s.Opt.LR))
	binary.LittleEndian.PutUint32(b[o+20:], math.Float32bits(s.Opt.Eps))
	binary.LittleEndian.PutUint32(b[o+24:], math.Float32bits(s.Opt.InitAcc))
	binary.LittleEndian.PutUint64(b[o+28:], s.Seed)
	return b, nil
}

// EncodeStats encodes a stats request.
func EncodeStats() []byte { return appendHead(nil, OpStats, "") }

// DecodeRequest parses a request. It never panics and never allocates in
// proportion to what the message claims: key and value slices are views.
func DecodeRequest(b []byte) (Request, error) {
	r, err := decodeRequest(b)
	if r.Name == "" {
		r.Name = string(r.name)
	}
	return r, err
}

// decodeRequest is DecodeRequest in place: the name stays a view (r.name)
// and r.Name is set only for OpDefine (its Spec keeps it), so the server
// decodes a pull or push without allocating.
func decodeRequest(b []byte) (Request, error) {
	var r Request
	if len(b) < 4 {
		return r, fmt.Errorf("%w: request of %d bytes", ErrMalformed, len(b))
	}
	if b[0] != protoVersion {
		return r, fmt.Errorf("%w: protocol version %d, want %d", ErrMalformed, b[0], protoVersion)
	}
	r.Op = Op(b[1])
	if b[2] != 0 {
		return r, fmt.Errorf("%w: flags %#x", ErrMalformed, b[2])
	}
	nl := int(b[3])
	if len(b) < 4+nl {
		return r, fmt.Errorf("%w: name of %d bytes in a %d-byte request", ErrMalformed, nl, len(b))
	}
	r.name = b[4 : 4+nl]
	body := b[4+nl:]
	u32 := func(o int) int { return int(binary.LittleEndian.Uint32(body[o:])) }
	switch r.Op {
	case OpPull, OpPush:
		if len(body) < 8 {
			return r, fmt.Errorf("%w: %v body of %d bytes", ErrMalformed, r.Op, len(body))
		}
		r.Dim, r.N = u32(0), u32(4)
		if r.N > maxWireKeys || r.Dim > maxWireFloats {
			return r, fmt.Errorf("%w: %v of %d keys of dim %d", ErrMalformed, r.Op, r.N, r.Dim)
		}
		// A push carries n*dim floats, a pull's response as many: both
		// are bounded as one message's (a pull of a few KiB of keys must
		// not make the server build GiBs of rows).
		nf := r.N * r.Dim
		if nf > maxWireFloats {
			return r, fmt.Errorf("%w: %v of %d x %d values, more than a message's %d", ErrMalformed, r.Op, r.N, r.Dim, maxWireFloats)
		}
		want := 8 + 8*r.N
		if r.Op == OpPush {
			want += 4 * nf
		}
		if len(body) != want {
			return r, fmt.Errorf("%w: %v of %d keys (dim %d) needs %d body bytes, got %d", ErrMalformed, r.Op, r.N, r.Dim, want, len(body))
		}
		r.keys = body[8 : 8+8*r.N]
		r.vals = body[8+8*r.N:]
	case OpPullDense, OpPushDense:
		if len(body) < 4 {
			return r, fmt.Errorf("%w: %v body of %d bytes", ErrMalformed, r.Op, len(body))
		}
		r.N = u32(0)
		if r.N > maxWireFloats {
			return r, fmt.Errorf("%w: %v of %d values", ErrMalformed, r.Op, r.N)
		}
		want := 4
		if r.Op == OpPushDense {
			want += 4 * r.N
		}
		if len(body) != want {
			return r, fmt.Errorf("%w: %v of %d values needs %d body bytes, got %d", ErrMalformed, r.Op, r.N, want, len(body))
		}
		r.vals = body[4:]
	case OpDefine:
		if len(body) != defineBody {
			return r, fmt.Errorf("%w: define body of %d bytes, want %d", ErrMalformed, len(body), defineBody)
		}
		r.Name = string(r.name)
		s := Spec{Name: r.Name, Kind: Kind(body[0]), Opt: Optimizer{Kind: OptKind(body[1])}}
		s.Dim = u32(4)
		n := binary.LittleEndian.Uint64(body[8:])
		if s.Kind == Dense {
			if n > maxWireFloats {
				return r, fmt.Errorf("%w: dense size %d", ErrMalformed, n)
			}
			s.Size = int(n)
		} else {
			s.Rows = n
		}
		s.Opt.LR = math.Float32frombits(binary.LittleEndian.Uint32(body[16:]))
		s.Opt.Eps = math.Float32frombits(binary.LittleEndian.Uint32(body[20:]))
		s.Opt.InitAcc = math.Float32frombits(binary.LittleEndian.Uint32(body[24:]))
		s.Seed = binary.LittleEndian.Uint64(body[28:])
		r.Spec, r.Dim = s, s.Dim
	case OpStats:
		if len(body) != 0 || nl != 0 {
			return r, fmt.Errorf("%w: stats request with %d name and %d body bytes", ErrMalformed, nl, len(body))
		}
	default:
		return r, fmt.Errorf("%w: unknown op %d", ErrMalformed, b[1])
	}
	return r, nil
}

// Error codes in responses, and the sentinels they match.
const (
	codeMalformed    = 1
	codeUnknownParam = 2
	codeUnknownKey   = 3
	codeDim          = 4
	codeTooLarge     = 5
	codeNaN          = 6
	codeConflict     = 7
	codeInternal     = 8
)

// Sentinels a *ServerError matches with errors.Is.
var (
	ErrUnknownParam = errors.New("ps: unknown parameter")
	ErrUnknownKey   = errors.New("ps: unknown key")
	ErrDim          = errors.New("ps: wrong dimension")
	ErrTooLarge     = errors.New("ps: batch too large")
	ErrNaN          = errors.New("ps: non-finite gradient")
	ErrConflict     = errors.New("ps: parameter defined differently")
	ErrInternal     = errors.New("ps: server error")
	// ErrStateLost is returned once per server restart: the server's shard
	// came back empty (re-initialised), so what was pushed to it is gone.
	ErrStateLost = errors.New("ps: server restarted, its shard's state was lost")
)

var codeErr = map[uint8]error{codeMalformed: ErrMalformed, codeUnknownParam: ErrUnknownParam, codeUnknownKey: ErrUnknownKey,
	codeDim: ErrDim, codeTooLarge: ErrTooLarge, codeNaN: ErrNaN, codeConflict: ErrConflict, codeInternal: ErrInternal}

// ServerError is an error a server answered with.
type ServerError struct {
	Server int // index in the client's server list
	Code   uint8
	Msg    string
}

func (e *ServerError) Error() string {
	if e == nil {
		return "ps: nil ServerError"
	}
	return fmt.Sprintf("ps: server %d: %s", e.Server, e.Msg)
}

// Unwrap makes errors.Is(err, ErrUnknownKey) and friends work.
func (e *ServerError) Unwrap() error {
	if e == nil {
		return nil
	}
	return codeErr[e.Code]
}

// codeError is what the store returns: a code and a message.
type codeError struct {
	code uint8
	msg  string
}

func (e *codeError) Error() string { return e.msg }
func (e *codeError) Unwrap() error { return codeErr[e.code] }

func errorf(code uint8, format string, a ...any) error {
	return &codeError{code: code, msg: fmt.Sprintf(format, a...)}
}

func appendRespHead(b []byte, inc uint64) []byte {
	b = append(b, 0, 0, 0, 0)
	return binary.LittleEndian.AppendUint64(b, inc)
}

func appendErrResp(b []byte, inc uint64, err error) []byte {
	code := uint8(codeInternal)
	var ce *codeError
	if errors.As(err, &ce) {
		code = ce.code
	} else if errors.Is(err, ErrMalformed) {
		code = codeMalformed
	}
	msg := err.Error()
	if len(msg) > 4000 {
		msg = msg[:4000]
	}
	b = append(b, 1, code, 0, 0)
	b = binary.LittleEndian.AppendUint64(b, inc)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(msg)))
	return append(b, msg...)
}

// response is a decoded response: body is a view.
type response struct {
	inc  uint64
	body []byte
}

// decodeResponse checks the header; an error response becomes a
// *ServerError.
func decodeResponse(b []byte, server int) (response, error) {
	if len(b) < respHeader {
		return response{}, fmt.Errorf("%w: response of %d bytes", ErrMalformed, len(b))
	}
	r := response{inc: binary.LittleEndian.Uint64(b[4:]), body: b[respHeader:]}
	switch b[0] {
	case 0:
		return r, nil
	case 1:
		if len(r.body) < 2 || len(r.body) != 2+int(binary.LittleEndian.Uint16(r.body)) {
			return r, fmt.Errorf("%w: error response of %d bytes", ErrMalformed, len(b))
		}
		return r, &ServerError{Server: server, Code: b[1], Msg: string(r.body[2:])}
	}
	return r, fmt.Errorf("%w: response status %d", ErrMalformed, b[0])
}
