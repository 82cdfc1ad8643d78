package tlsfiles

import (
	"bytes"
	"crypto/x509"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// Revocations are the certificate revocation lists of one file, by issuer:
// what a client's certificate chain is checked against (Check), as nginx's
// ssl_crl and HAProxy's crl-file check it. The lists do not change once
// read; Check may be called from any goroutine.
type Revocations struct {
	byIssuer map[string]*crl // by the issuer's raw subject
	revoked  int
}

// crl is one issuer's revocation list and its revoked serial numbers.
type crl struct {
	list    *x509.RevocationList
	serials map[string]struct{} // big.Int.String of each
	// signer is the last issuer certificate the list's signature was
	// checked against and found its: a handshake through the same
	// certificate does not check it again (a signature check costs about
	// 50 µs; a comparison of the certificate's bytes, well under one).
	signer atomic.Pointer[x509.Certificate]
}

// signedBy says whether issuer signed c's list.
func (c *crl) signedBy(issuer *x509.Certificate) bool {
	if s := c.signer.Load(); s != nil && s.Equal(issuer) {
		return true
	}
	if c.list.CheckSignatureFrom(issuer) != nil {
		return false
	}
	c.signer.Store(issuer)
	return true
}

// ReadRevocations reads file's PEM CRLs ("X509 CRL" blocks; a file with
// none is read as one DER CRL), keeping the latest of each issuer (by
// thisUpdate). A CRL whose issuer names one of cas must be signed by it;
// another's (an intermediate CA's, which clients send) is checked against
// that CA when a chain through it is. key is the config key that named
// the file, for errors.
func ReadRevocations(key, file string, cas []*x509.Certificate) (*Revocations, error) {
	data, err := readFile(key, file)
	if err != nil {
		return nil, err
	}
	blocks := pemBlocks(data, "X509 CRL")
	der := len(blocks) == 0
	if der {
		blocks = [][]byte{data} // one DER CRL, or no CRL at all
	}
	r := &Revocations{byIssuer: map[string]*crl{}}
	for i, block := range blocks {
		list, err := x509.ParseRevocationList(block)
		switch {
		case err != nil && der:
			return nil, fmt.Errorf("%s: %s holds no CRL (PEM \"X509 CRL\" blocks, or one DER CRL)", key, file)
		case err != nil:
			return nil, fmt.Errorf("%s: %s: CRL %d: %w", key, file, i+1, err)
		}
		if err := signedByItsCA(list, cas); err != nil {
			return nil, fmt.Errorf("%s: %s: CRL %d: %w", key, file, i+1, err)
		}
		if old := r.byIssuer[string(list.RawIssuer)]; old != nil && !list.ThisUpdate.After(old.list.ThisUpdate) {
			continue
		}
		c := &crl{list: list, serials: make(map[string]struct{}, len(list.RevokedCertificateEntries))}
		for _, e := range list.RevokedCertificateEntries {
			c.serials[e.SerialNumber.String()] = struct{}{}
		}
		r.byIssuer[string(list.RawIssuer)] = c
	}
	for _, c := range r.byIssuer {
		r.revoked += len(c.serials)
	}
	return r, nil
}

// signedByItsCA checks list's signature against the CAs of cas its issuer
// names: one of them must have signed it. None named: nothing to check yet.
func signedByItsCA(list *x509.RevocationList, cas []*x509.Certificate) error {
	named := false
	for _, ca := range cas {
		if bytes.Equal(ca.RawSubject, list.RawIssuer) {
			if list.CheckSignatureFrom(ca) == nil {
				return nil
			}
			named = true
		}
	}
	if named {
		return fmt.Errorf("issued in the name of %q, whose CA did not sign it", list.Issuer)
	}
	return nil
}

// Issuers is how many issuers' CRLs r holds.
func (r *Revocations) Issuers() int { return len(r.byIssuer) }

// Revoked is how many serial numbers r's CRLs revoke in all.
func (r *Revocations) Revoked() int { return r.revoked }

// NextUpdates returns each issuer's name and when its list says the next
// one is due (zero: it says not), sorted by issuer: past that, Check
// refuses every certificate the issuer signed.
func (r *Revocations) NextUpdates() []IssuerUpdate {
	out := make([]IssuerUpdate, 0, len(r.byIssuer))
	for _, c := range r.byIssuer {
		out = append(out, IssuerUpdate{Issuer: c.list.Issuer.String(), Next: c.list.NextUpdate})
	}
	slices.SortFunc(out, func(a, b IssuerUpdate) int { return strings.Compare(a.Issuer, b.Issuer) })
	return out
}

// IssuerUpdate is an issuer's name and its list's nextUpdate.
type IssuerUpdate struct {
	Issuer string
	Next   time.Time
}

// Expired lists the issuers whose CRL is past its nextUpdate at now, or
// not valid before a thisUpdate still to come: Check refuses every
// certificate they issued.
func (r *Revocations) Expired(now time.Time) []string {
	var out []string
	for _, c := range r.byIssuer {
		if c.outdated(now) != "" {
			out = append(out, c.list.Issuer.String())
		}
	}
	return out
}

// The reasons Check refuses a chain for (RefusalError.Reason).
const (
	Revoked      = "revoked"       // a certificate of the chain is on its issuer's CRL
	NoCRL        = "no_crl"        // the file holds no CRL of a certificate's issuer
	CRLOutdated  = "crl_outdated"  // the issuer's CRL is past its nextUpdate, or not valid yet
	CRLSignature = "crl_signature" // the issuer's CRL is not signed by the issuer in the chain
)

// RefusalError says why Check refused a client's chain.
type RefusalError struct {
	Reason  string // Revoked, NoCRL, CRLOutdated or CRLSignature
	Subject string // the certificate refused, and its serial number
	Serial  string
	Detail  string
}

func (e *RefusalError) Error() string {
	return fmt.Sprintf("client certificate %q (serial %s): %s", e.Subject, e.Serial, e.Detail)
}

// Check checks a client's verified chains (crypto/tls's, leaf first, each
// ending at one of the trusted CAs) at now: at least one must hold no
// certificate its issuer's CRL revokes, with each issuer's CRL in r, valid
// at now and signed by that issuer. The trusted CA that ends a chain is not
// looked up (it is trusted by being in the CA file; taking it out of it
// untrusts it), so a chain of a CA's certificate alone passes. No chain (a
// client that showed no certificate, where that is allowed) passes. The
// error of the first chain is returned, a *RefusalError.
func (r *Revocations) Check(chains [][]*x509.Certificate, now time.Time) error {
	var first error
	for _, chain := range chains {
		err := r.checkChain(chain, now)
		if err == nil {
			return nil
		}
		if first == nil {
			first = err
		}
	}
	return first
}

func (r *Revocations) checkChain(chain []*x509.Certificate, now time.Time) error {
	for i := 0; i+1 < len(chain); i++ {
		cert, issuer := chain[i], chain[i+1]
		refuse := func(reason, detail string, args ...any) error {
			return &RefusalError{Reason: reason, Subject: cert.Subject.String(), Serial: cert.SerialNumber.String(),
				Detail: fmt.Sprintf(detail, args...)}
		}
		c := r.byIssuer[string(cert.RawIssuer)]
		switch {
		case c == nil:
			return refuse(NoCRL, "no CRL of its issuer %q in the CRL file", issuer.Subject)
		case !c.signedBy(issuer):
			return refuse(CRLSignature, "the CRL of its issuer %q is not signed by that issuer", issuer.Subject)
		}
		if why := c.outdated(now); why != "" {
			return refuse(CRLOutdated, "the CRL of its issuer %q %s", issuer.Subject, why)
		}
		if _, ok := c.serials[cert.SerialNumber.String()]; ok {
			return refuse(Revoked, "revoked by its issuer %q", issuer.Subject)
		}
	}
	return nil
}

// outdated says why c is not valid at now ("" when it is).
func (c *crl) outdated(now time.Time) string {
	switch {
	case now.Before(c.list.ThisUpdate):
		return fmt.Sprintf("is not valid before %s", c.list.ThisUpdate.UTC().Format(time.RFC3339))
	case !c.list.NextUpdate.IsZero() && now.After(c.list.NextUpdate):
		return fmt.Sprintf("expired at %s (its nextUpdate)", c.list.NextUpdate.UTC().Format(time.RFC3339))
	}
	return ""
}
