package frontend

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
)

// An x-forwarded-client-cert value names the certificate of its last
// element (the nearest proxy's client) as the TLS handshake's would be
// named: the Subject's common name, else the first URI, else the first DNS
// name; quoted values, RFC 2253's escapes and OpenSSL's one-line subjects
// are read.
func TestTheForwardedClientCertNamesItsLastElementsCertificate(t *testing.T) {
	for _, tc := range []struct{ header, want string }{
		// Envoy's documentation's examples.
		{`By=http://frontend.lyft.com;Hash=468ed33be74eee6556d90c0149c1309e9ba61d6425303443c0748a02dd8de688;Subject="/C=US/ST=CA/L=San Francisco/OU=Lyft/CN=Test Client";URI=http://testclient.lyft.com`, "Test Client"},
		{`By=http://frontend.lyft.com;Hash=468ed33be74eee6556d90c0149c1309e9ba61d6425303443c0748a02dd8de688;URI=http://testclient.lyft.com,By=http://backend.lyft.com;Hash=9ba61d6425303443c0748a02dd8de688468ed33be74eee6556d90c0149c1309e;URI=http://frontend.lyft.com`, "http://frontend.lyft.com"},
		{`By=http://frontend.lyft.com;Hash=468ed33be74eee6556d90c0149c1309e9ba61d6425303443c0748a02dd8de688;Subject="CN=Test Client,OU=Lyft,L=San Francisco,ST=CA,C=US";URI=http://testclient.lyft.com;DNS=lyft.com;DNS=www.lyft.com`, "Test Client"},
		// Istio: a SPIFFE certificate has no subject.
		{`By=spiffe://cluster.local/ns/llm/sa/fastroute;Hash=abc;Subject="";URI=spiffe://cluster.local/ns/batch/sa/summarizer`, "spiffe://cluster.local/ns/batch/sa/summarizer"},
		{`Hash=abc;DNS=client.example.com;DNS=other.example.com`, "client.example.com"},
		{`hash=abc;uri=spiffe://a/b;subject="O=org"`, "spiffe://a/b"},
		{`Subject="CN=Smith\, John+UID=7,O=Org";URI=spiffe://x`, "Smith, John"},
		{`Subject="CN=caf\C3\A9,O=Org"`, "café"},
		{`Subject="CN=say \"hi\",O=Org"`, `say "hi"`},
		{`Subject="O=a\,b, CN = spaced ,C=US"`, "spaced"},
		{`By=x;Subject="CN=first";URI=u,By=y;Subject="CN=last"`, "last"},
		{`Subject="CN=a,b";URI=u,`, ""}, // an empty last element
		{``, ""},
		{`no pairs here`, ""},
		{`Subject=;URI=;DNS=`, ""},
		{`Subject="unterminated`, ""},
	} {
		var buf [certNameBytes]byte
		assert.Equal(t, tc.want, string(forwardedCertName([]byte(tc.header), buf[:0])), tc.header)
	}
}

func TestAForwardedCertNameAllocatesNothing(t *testing.T) {
	header := []byte(`By=spiffe://cluster.local/ns/llm/sa/fastroute;Hash=abc;Subject="CN=Smith\, John,O=Org";URI=spiffe://cluster.local/ns/batch/sa/summarizer`)
	allocs := testing.AllocsPerRun(100, func() {
		var buf [certNameBytes]byte
		if len(forwardedCertName(header, buf[:0])) == 0 {
			t.Fatal("no name")
		}
	})
	assert.Zero(t, allocs)
}

// FuzzForwardedCertName: any header value is read without a panic, and
// the name read is no longer than the value.
func FuzzForwardedCertName(f *testing.F) {
	for _, seed := range []string{
		`By=spiffe://a;Hash=abc;Subject="";URI=spiffe://b`,
		`Subject="/C=US/CN=Test Client";URI=http://x,By=y;URI=z`,
		`Subject="CN=Smith\, John+UID=7,O=Org"`,
		`Subject="CN=caf\C3\A9"`, `Subject="\`, `"""`, `,,;;==`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, header []byte) {
		in := bytes.Clone(header)
		var buf [certNameBytes]byte
		name := forwardedCertName(header, buf[:0])
		if len(name) > len(header) {
			t.Fatalf("%q named %q, longer than itself", header, name)
		}
		if !bytes.Equal(in, header) {
			t.Fatalf("the header changed: %q to %q", in, header)
		}
	})
}
