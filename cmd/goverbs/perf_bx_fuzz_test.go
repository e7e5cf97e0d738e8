package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/goverbs/goverbs/bx"
)

// FuzzPerfTCPRead: goverbs perf --tcp's frames (a length, a bx header's
// room, the payload) come from whoever connects to the server's port, or
// from the server. read must not panic, must allocate in proportion to
// the bytes that arrive, not to the length a frame claims (up to 8 MiB,
// on each connection), and gives back what write framed.
func FuzzPerfTCPRead(f *testing.F) {
	frame := func(p []byte) []byte {
		var out bytes.Buffer
		t := &perfTCP{w: bufio.NewWriter(&out)}
		var hdr [4 + bx.HeaderSize]byte
		if err := t.write(hdr[:], p); err != nil {
			f.Fatal(err)
		}
		return out.Bytes()
	}
	f.Add(frame([]byte("ping")))
	f.Add(append(frame(nil), frame(bytes.Repeat([]byte{7}, 300))...))
	claim := make([]byte, 4+bx.HeaderSize, 4+bx.HeaderSize+100)
	binary.LittleEndian.PutUint32(claim, uint32(bx.HeaderSize+perfMaxSize)) // 8 MiB claimed, 100 bytes sent
	f.Add(append(claim, bytes.Repeat([]byte{1}, 100)...))
	pt := &perfTCP{r: bufio.NewReaderSize(nil, 64<<10)}
	f.Fuzz(func(t *testing.T, in []byte) {
		var frames [][]byte
		n := allocated(func() {
			pt.r.Reset(bytes.NewReader(in))
			pt.resp, frames = nil, frames[:0]
			for {
				p, err := pt.read()
				if err != nil {
					return
				}
				frames = append(frames, bytes.Clone(p))
			}
		})
		if n > 4*uint64(len(in))+256<<10 {
			t.Fatalf("reading %d bytes allocated %d", len(in), n)
		}
		off := 0
		for i, p := range frames {
			off += 4 + bx.HeaderSize
			if off+len(p) > len(in) || !bytes.Equal(in[off:off+len(p)], p) {
				t.Fatalf("frame %d (%d bytes at %d) is not what was sent", i, len(p), off)
			}
			off += len(p)
		}
	})
}
