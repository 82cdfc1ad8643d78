package frontend

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// decodeInPieces decodes body cut into pieces of size, each decoded in
// place as a relay would (chunkRelay), and returns the data, how many
// bytes the body took and the first error.
func decodeInPieces(body []byte, size int) (data []byte, used int, done bool, err error) {
	var d dechunker
	body = bytes.Clone(body)
	for len(body) > 0 && !d.done() {
		p := body[:min(size, len(body))]
		n, u, err := d.decode(p)
		data, used = append(data, p[:n]...), used+u
		if err != nil {
			return data, used, d.done(), err
		}
		body = body[len(p):]
	}
	return data, used, d.done(), nil
}

// Any chunked framing decodes to its data, however its bytes are cut
// apart: sizes in either case, extensions, trailer fields, a chunk larger
// than a read; the body ends at its empty line, and bytes past it are not
// taken.
func TestADechunkerDecodesAnyFramingInAnyPieces(t *testing.T) {
	big := strings.Repeat("z", 9000)
	for name, tc := range map[string]struct{ body, data string }{
		"empty":             {"0\r\n\r\n", ""},
		"events":            {"9\r\ndata: a\n\n\r\n9\r\ndata: b\n\n\r\n0\r\n\r\n", "data: a\n\ndata: b\n\n"},
		"hex in capitals":   {"1A\r\n" + strings.Repeat("x", 26) + "\r\n0\r\n\r\n", strings.Repeat("x", 26)},
		"extensions":        {"3;name=value\r\nabc\r\n2 \t; x\r\nde\r\n1 \r\nf\r\n0;last\r\n\r\n", "abcdef"},
		"trailers":          {"3\r\nabc\r\n0\r\nX-Checksum: 1\r\nX-Other: 2\r\n\r\n", "abc"},
		"a large chunk":     {fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(big), big), big},
		"data like framing": {"5\r\n0\r\n\r\n\r\n0\r\n\r\n", "0\r\n\r\n"},
	} {
		t.Run(name, func(t *testing.T) {
			for size := 1; size <= len(tc.body); size += 1 + size/8 {
				body := tc.body + "HTTP/1.1 200 OK" // bytes past the answer
				data, used, done, err := decodeInPieces([]byte(body), size)
				require.NoError(t, err, "pieces of %d", size)
				require.True(t, done, "pieces of %d", size)
				assert.Equal(t, tc.data, string(data), "pieces of %d", size)
				assert.Equal(t, len(tc.body), used, "pieces of %d: the body ends at its empty line", size)
			}
		})
	}
}

// Broken framing is an error at the byte that breaks it, with the data
// before it decoded; a body cut short is not done.
func TestADechunkerRefusesBrokenFraming(t *testing.T) {
	for name, tc := range map[string]struct{ body, data string }{
		"no size":               {"\r\nabc", ""},
		"not hex":               {"3\r\nabc\r\ng\r\n", "abc"},
		"LF alone after a size": {"3\nabc", ""},
		"LF in an extension":    {"3;a\nabc", ""},
		"data longer than said": {"3\r\nabcd\r\n", "abc"},
		"CR without LF":         {"3\r\nabc\rx", "abc"},
		"a size past 256 TiB":   {"1000000000000\r\n", ""},
		"16 digits":             {"0000000000000003\r\nabc", ""},
		"space inside the size": {"1 2\r\n", ""},
		"no CRLF after the end": {"0\r\n\rx", ""},
		"long extensions":       {"1;" + strings.Repeat("e", maxChunkOverhead+1) + "\r\na\r\n", ""},
		"long trailers":         {"0\r\nX: " + strings.Repeat("t", maxChunkOverhead) + "\r\n\r\n", ""},
	} {
		t.Run(name, func(t *testing.T) {
			data, _, done, err := decodeInPieces([]byte(tc.body), 7)
			require.ErrorIs(t, err, errBadChunk)
			assert.False(t, done)
			assert.Equal(t, tc.data, string(data))
		})
	}
	data, _, done, err := decodeInPieces([]byte("000000000000003\r\nabc\r\n0\r\nT: 1\n\n"), 3)
	require.NoError(t, err, "15 digits, leading zeros included, and trailer lines ending in bare LFs, as fasthttp takes them")
	assert.True(t, done)
	assert.Equal(t, "abc", string(data))
	data, used, done, err := decodeInPieces([]byte("5\r\nabc"), 2)
	require.NoError(t, err)
	assert.False(t, done, "cut short: more to come")
	assert.Equal(t, "abc", string(data))
	assert.Equal(t, 6, used)
}

// FuzzADechunkerAgreesWithFasthttp: whatever bytes a worker sends as a
// chunked body, cut into pieces of any size, the dechunker never reads
// past the body's end, and a body fasthttp's reader takes whole decodes
// to the same data, ending at the same byte.
func FuzzADechunkerAgreesWithFasthttp(f *testing.F) {
	f.Add([]byte("9\r\ndata: a\n\n\r\n0\r\n\r\n"), uint16(3))
	f.Add([]byte("3;x=y\r\nabc\r\n0\r\nT: 1\r\n\r\nrest"), uint16(1))
	f.Add([]byte("A\r\n0123456789\r\n0\r\n\r\n"), uint16(5))
	f.Add([]byte("3\r\nabc\n0\r\n\r\n"), uint16(2))
	f.Fuzz(func(t *testing.T, body []byte, size uint16) {
		data, used, done, err := decodeInPieces(body, int(size%64)+1)
		require.LessOrEqual(t, used, len(body))
		require.LessOrEqual(t, len(data), used)

		var resp fasthttp.Response
		br := bufio.NewReader(io.MultiReader(strings.NewReader("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"), bytes.NewReader(body)))
		if resp.ReadLimitBody(br, 1<<20) != nil { // unbounded, it makes room for the size a line says
			return // fasthttp refuses it: it may be stricter (trailer names) or read past a cut
		}
		rest, _ := io.ReadAll(br)
		require.NoError(t, err, "fasthttp decoded %q", body)
		require.True(t, done)
		assert.Equal(t, string(resp.Body()), string(data))
		assert.Equal(t, len(body)-len(rest), used, "the body ends where fasthttp's does")
	})
}
