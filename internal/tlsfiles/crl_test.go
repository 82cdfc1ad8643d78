package tlsfiles

import (
	"crypto/x509"
	"errors"
	"testing"
	"time"

	"github.com/fastroute/fastroute/internal/testpki"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// refusal is the reason of Check's error ("" when it passed).
func refusal(t *testing.T, err error) string {
	t.Helper()
	if err == nil {
		return ""
	}
	var r *RefusalError
	require.True(t, errors.As(err, &r), "%v", err)
	return r.Reason
}

// A client's chain is checked link by link against its issuers' CRLs: the
// leaf against its intermediate's, the intermediate against the root's; the
// root, trusted by being in the CA file, is not looked up.
func TestChainsAreCheckedAgainstTheirIssuersCRLs(t *testing.T) {
	pki := testpki.NewTwoTier(t, "root CA", "issuing CA")
	root, inter, alice, bob, direct := pki.Root, pki.Issuing, pki.Alice, pki.Bob, pki.Carol
	now := time.Now()
	hour := time.Hour
	file := testpki.WriteFile(t, "crl.pem",
		testpki.CRLPEM(root.CRL(now.Add(-hour), now.Add(hour), 7)),
		testpki.CRLPEM(inter.CRL(now.Add(-hour), now.Add(hour), 21)))
	crls, err := ReadRevocations("key k", file, []*x509.Certificate{root.Cert})
	require.NoError(t, err)
	assert.Equal(t, 2, crls.Issuers())
	assert.Equal(t, 2, crls.Revoked())
	assert.Empty(t, crls.Expired(now))
	next := now.Add(hour).Truncate(time.Second).UTC()
	assert.Equal(t, []IssuerUpdate{{"CN=issuing CA", next}, {"CN=root CA", next}}, crls.NextUpdates(), "by issuer")

	chain := func(l *testpki.Leaf) [][]*x509.Certificate {
		return [][]*x509.Certificate{append(append([]*x509.Certificate{}, l.Chain...), root.Cert)}
	}
	assert.NoError(t, crls.Check(chain(alice), now))
	assert.NoError(t, crls.Check(chain(alice), now), "again, the lists' signatures known good")
	// A CA of the same name with another key (which the root signed too):
	// the issuing CA's list is not its, however often it was found good.
	twin := root.Intermediate("issuing CA", 101)
	err = crls.Check(chain(twin.Client("mallory", 30, twin)), now)
	assert.Equal(t, CRLSignature, refusal(t, err))
	assert.NoError(t, crls.Check(chain(direct), now), "signed by the root itself")
	assert.NoError(t, crls.Check(nil, now), "no certificate shown (client_auth optional)")
	assert.NoError(t, crls.Check([][]*x509.Certificate{{root.Cert}}, now), "a trusted CA's own certificate")
	err = crls.Check(chain(bob), now)
	assert.Equal(t, Revoked, refusal(t, err))
	assert.EqualError(t, err, `client certificate "CN=bob" (serial 21): revoked by its issuer "CN=issuing CA"`)
	assert.NoError(t, crls.Check(append(chain(bob), chain(alice)...), now), "one chain that passes is enough")
	assert.Equal(t, Revoked, refusal(t, crls.Check(append(chain(bob), chain(bob)...), now)))

	// The intermediate revoked by the root: every client it signed is out.
	file = testpki.WriteFile(t, "crl.pem",
		testpki.CRLPEM(root.CRL(now.Add(-hour), now.Add(hour), 100)),
		testpki.CRLPEM(inter.CRL(now.Add(-hour), now.Add(hour))))
	crls, err = ReadRevocations("key k", file, []*x509.Certificate{root.Cert})
	require.NoError(t, err)
	err = crls.Check(chain(alice), now)
	assert.Equal(t, Revoked, refusal(t, err))
	assert.Contains(t, err.Error(), `"CN=issuing CA" (serial 100)`)
	assert.NoError(t, crls.Check(chain(direct), now))

	// No CRL of the intermediate: its clients are refused, as nginx's
	// ssl_crl refuses them ("unable to get certificate CRL").
	file = testpki.WriteFile(t, "crl.pem", testpki.CRLPEM(root.CRL(now.Add(-hour), now.Add(hour))))
	crls, err = ReadRevocations("key k", file, []*x509.Certificate{root.Cert})
	require.NoError(t, err)
	assert.Equal(t, NoCRL, refusal(t, crls.Check(chain(alice), now)))
	assert.NoError(t, crls.Check(chain(direct), now))

	// Out of date, or not valid yet: refused, and listed by Expired.
	file = testpki.WriteFile(t, "crl.pem",
		testpki.CRLPEM(root.CRL(now.Add(-4*hour), now.Add(hour))),
		testpki.CRLPEM(inter.CRL(now.Add(-2*hour), now.Add(-hour))))
	crls, err = ReadRevocations("key k", file, []*x509.Certificate{root.Cert})
	require.NoError(t, err)
	err = crls.Check(chain(alice), now)
	assert.Equal(t, CRLOutdated, refusal(t, err))
	assert.Contains(t, err.Error(), "expired at ")
	assert.Equal(t, []string{"CN=issuing CA"}, crls.Expired(now))
	assert.NoError(t, crls.Check(chain(alice), now.Add(-90*time.Minute)), "valid then")
	assert.Equal(t, CRLOutdated, refusal(t, crls.Check(chain(alice), now.Add(-3*hour))), "not valid yet then")

	// A CRL in the intermediate's name signed by another key (which
	// cannot be checked as the file is read: the intermediate comes with
	// the client's chain) is checked against the chain's intermediate.
	file = testpki.WriteFile(t, "crl.pem",
		testpki.CRLPEM(root.CRL(now.Add(-hour), now.Add(hour))),
		testpki.CRLPEM(inter.CRLSignedBy(testpki.NewKey(t), now.Add(-hour), now.Add(hour))))
	crls, err = ReadRevocations("key k", file, []*x509.Certificate{root.Cert})
	require.NoError(t, err)
	assert.Equal(t, CRLSignature, refusal(t, crls.Check(chain(alice), now)))
}

// The file: PEM blocks (others skipped) or one DER CRL; the latest CRL of
// an issuer wins; a CRL in the name of a CA of the file that it did not
// sign, a block that does not parse, or a file that holds no CRL fails the
// read with the key and the file named.
func TestRevocationFilesAreReadWithClearErrors(t *testing.T) {
	root := testpki.Root(t, "root CA")
	alice := root.Client("alice", 20)
	now := time.Now()
	hour := time.Hour
	cas := []*x509.Certificate{root.Cert}
	chain := [][]*x509.Certificate{{alice.Cert, root.Cert}}

	der := testpki.WriteFile(t, "crl.der", root.CRL(now.Add(-hour), now.Add(hour), 20))
	crls, err := ReadRevocations("key k", der, cas)
	require.NoError(t, err)
	assert.Equal(t, Revoked, refusal(t, crls.Check(chain, now)))

	mixed := testpki.WriteFile(t, "crl.pem", testpki.CertPEM(root.Cert),
		testpki.CRLPEM(root.CRL(now.Add(-2*hour), now.Add(hour), 20)),
		testpki.CRLPEM(root.CRL(now.Add(-hour), now.Add(hour))),       // the latest: alice no longer revoked
		testpki.CRLPEM(root.CRL(now.Add(-3*hour), now.Add(hour), 20))) // older, after it in the file
	crls, err = ReadRevocations("key k", mixed, cas)
	require.NoError(t, err)
	assert.Equal(t, 1, crls.Issuers())
	assert.NoError(t, crls.Check(chain, now), "the latest CRL of the issuer is the one read")

	forged := testpki.WriteFile(t, "crl.pem", testpki.CRLPEM(root.CRLSignedBy(testpki.NewKey(t), now.Add(-hour), now.Add(hour))))
	_, err = ReadRevocations("key k", forged, cas)
	assert.EqualError(t, err, "key k: "+forged+`: CRL 1: issued in the name of "CN=root CA", whose CA did not sign it`)

	bad := testpki.WriteFile(t, "crl.pem", testpki.CRLPEM(root.CRL(now.Add(-hour), now.Add(hour))), testpki.CRLPEM([]byte("not DER")))
	_, err = ReadRevocations("key k", bad, cas)
	assert.ErrorContains(t, err, "key k: "+bad+": CRL 2: ")

	for _, content := range []string{"", "no CRL here", string(testpki.CertPEM(root.Cert))} {
		none := testpki.WriteFile(t, "crl.pem", []byte(content))
		_, err = ReadRevocations("key k", none, cas)
		assert.EqualError(t, err, "key k: "+none+` holds no CRL (PEM "X509 CRL" blocks, or one DER CRL)`, "%q", content)
	}
	_, err = ReadRevocations("key k", "/no/such/file", cas)
	assert.ErrorContains(t, err, "key k: open /no/such/file")
}

// BenchmarkCheck checks a client's chain of two links (leaf, issuing CA)
// against the lists, as every handshake does.
func BenchmarkCheck(b *testing.B) {
	pki := testpki.NewTwoTier(b, "root CA", "issuing CA")
	now := time.Now()
	file := testpki.WriteFile(b, "crl.pem",
		testpki.CRLPEM(pki.Root.CRL(now.Add(-time.Hour), now.Add(time.Hour), 7)),
		testpki.CRLPEM(pki.Issuing.CRL(now.Add(-time.Hour), now.Add(time.Hour), 21)))
	crls, err := ReadRevocations("key k", file, []*x509.Certificate{pki.Root.Cert})
	require.NoError(b, err)
	chains := [][]*x509.Certificate{append(append([]*x509.Certificate{}, pki.Alice.Chain...), pki.Root.Cert)}
	b.ReportAllocs()
	for b.Loop() {
		if err := crls.Check(chains, now); err != nil {
			b.Fatal(err)
		}
	}
}
