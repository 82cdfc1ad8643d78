package frontend

import (
	"errors"
	"fmt"
)

// dechunker decodes a chunked message body (RFC 9112 §7.1) as its bytes
// come, in place: a chunked answer relayed straight from the worker's
// socket (chunkRelay) has its data moved to the front of the very buffer
// it was read into, where it is framed anew for the client. Chunk
// extensions and trailer fields are read and dropped, as fasthttp's body
// reader drops them, and bounded, as it bounds them (maxChunkOverhead);
// lines end in CRLF, a bare LF in a size line is refused (a smuggling
// vector, fasthttp refuses it too); the trailer section's lines, the empty
// one that ends it included, may end in a bare LF, as fasthttp's header
// scanner takes them.
type dechunker struct {
	state    uint8
	digits   uint8 // hex digits of the size line read
	left     int64 // the chunk's size while its line is read, then its data left to read
	overhead int   // bytes of the current chunk's extensions, or of the trailer section
}

// Where a dechunker stands.
const (
	inSize        uint8 = iota // a size line's hex digits
	afterSize                  // whitespace after the size
	inExtension                // an extension, up to the line's CR
	inSizeLF                   // the size line's LF
	inData                     // a chunk's data
	inDataCR                   // the CR after a chunk's data
	inDataLF                   // its LF
	atTrailerLine              // a trailer line's start; the empty line ends the body
	inTrailerLine              // a trailer field line, up to its LF
	inLastLF                   // the empty line's LF
	decoded                    // the body ended
)

// Bounds on a chunked body's framing: a chunk's extensions, or the trailer
// section, of at most maxChunkOverhead bytes (fasthttp's bound), a size
// line of at most maxChunkSizeDigits hex digits, leading zeros included
// (fasthttp's bound), and a size below maxChunkSize (256 TiB: a larger one
// is an error, not an overflow).
const (
	maxChunkOverhead   = 16 << 10
	maxChunkSizeDigits = 15
	maxChunkSize       = 1 << 48
)

// errBadChunk is a chunked answer whose framing is broken.
var errBadChunk = errors.New("malformed chunked answer")

// decode decodes p in place: the data it holds move to p[:n]. used is how
// much of p the body took: all of it unless the body ended within p, so
// that p[used:] are bytes past the answer. An error ends the decode at the
// broken byte; the data before it are in p[:n].
func (d *dechunker) decode(p []byte) (n, used int, err error) {
	i := 0
	for i < len(p) && d.state != decoded {
		if d.state == inData {
			k := int(min(int64(len(p)-i), d.left))
			n += copy(p[n:], p[i:i+k])
			i += k
			if d.left -= int64(k); d.left == 0 {
				d.state = inDataCR
			}
			continue
		}
		c := p[i]
		i++
		if err := d.step(c); err != nil {
			return n, i, err
		}
	}
	return n, i, nil
}

// step takes one byte of framing.
func (d *dechunker) step(c byte) error {
	switch d.state {
	case inSize:
		if v, ok := unhex(c); ok {
			switch {
			case d.digits == maxChunkSizeDigits:
				return fmt.Errorf("%w: chunk size of more than %d hex digits", errBadChunk, maxChunkSizeDigits)
			case d.left >= maxChunkSize>>4:
				return fmt.Errorf("%w: chunk size of 256 TiB or more", errBadChunk)
			}
			d.left, d.digits = d.left<<4|int64(v), d.digits+1
			return nil
		}
		if d.digits == 0 {
			return fmt.Errorf("%w: %q where a chunk size was due", errBadChunk, c)
		}
		d.state = afterSize
		fallthrough
	case afterSize:
		switch c {
		case '\r':
			d.state = inSizeLF
		case ';':
			d.state = inExtension
		case ' ', '\t':
		default:
			return fmt.Errorf("%w: %q after a chunk size", errBadChunk, c)
		}
	case inExtension:
		switch c {
		case '\r':
			d.state = inSizeLF
		case '\n':
			return fmt.Errorf("%w: LF in a chunk extension", errBadChunk)
		default:
			if d.overhead++; d.overhead > maxChunkOverhead {
				return fmt.Errorf("%w: chunk extensions longer than 16 KiB", errBadChunk)
			}
		}
	case inSizeLF:
		if c != '\n' {
			return fmt.Errorf("%w: CR without LF after a chunk size", errBadChunk)
		}
		d.digits, d.overhead = 0, 0
		d.state = inData
		if d.left == 0 {
			d.state = atTrailerLine
		}
	case inDataCR:
		return d.expect(c, '\r', inDataLF)
	case inDataLF:
		return d.expect(c, '\n', inSize)
	case inLastLF:
		return d.expect(c, '\n', decoded)
	case atTrailerLine, inTrailerLine:
		if d.overhead++; d.overhead > maxChunkOverhead {
			return fmt.Errorf("%w: trailer section longer than 16 KiB", errBadChunk)
		}
		switch {
		case d.state == atTrailerLine && c == '\r':
			d.state = inLastLF
		case d.state == atTrailerLine && c == '\n': // an empty line of a bare LF, as fasthttp's header scanner takes it
			d.state = decoded
		case c == '\n':
			d.state = atTrailerLine
		default:
			d.state = inTrailerLine
		}
	}
	return nil
}

// expect takes the framing byte c, which must be want, and moves on to next.
func (d *dechunker) expect(c, want byte, next uint8) error {
	if c != want {
		return fmt.Errorf("%w: %q where %q was due", errBadChunk, c, want)
	}
	d.state = next
	return nil
}

// done says the body ended: its last chunk and trailer section were read.
func (d *dechunker) done() bool { return d.state == decoded }

// unhex is the value of the hex digit c.
func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
