package bearer

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestATokenIsSentAndCheckedAsABearerHeader(t *testing.T) {
	tok := New("s3cret")
	assert.Equal(t, "Bearer s3cret", string(tok.Header()))
	assert.True(t, tok.IsSet())
	assert.True(t, tok.Matches([]byte("Bearer s3cret")))
	for _, wrong := range []string{"", "Bearer", "Bearer s3cre", "Bearer s3cret ", "bearer s3cret", "s3cret"} {
		assert.False(t, tok.Matches([]byte(wrong)), "%q", wrong)
	}

	tok.Set("n3w")
	assert.False(t, tok.Matches([]byte("Bearer s3cret")), "the old token is refused once a new one is set")
	assert.True(t, tok.Matches([]byte("Bearer n3w")))
}

func TestNoTokenSendsNothingAndMatchesNothing(t *testing.T) {
	var nilToken *Token
	for name, tok := range map[string]*Token{"nil": nilToken, "zero": {}, "empty": New(""), "cleared": New("x")} {
		if name == "cleared" {
			tok.Set("")
		}
		assert.Nil(t, tok.Header(), name)
		assert.False(t, tok.IsSet(), name)
		assert.False(t, tok.Matches(nil), name)
		assert.False(t, tok.Matches([]byte("Bearer ")), name)
	}
}

func TestReadingATokenAllocatesNothing(t *testing.T) {
	tok := New("s3cret")
	auth := []byte("Bearer s3cret")
	allocs := testing.AllocsPerRun(1000, func() {
		if tok.Header() == nil || !tok.Matches(auth) {
			t.Fatal("token lost")
		}
	})
	assert.Zero(t, allocs)
}

// TestATokenChangesWhileItIsRead runs under -race: readers see the old
// token or the new one, whole.
func TestATokenChangesWhileItIsRead(t *testing.T) {
	tok := New("a")
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				h := string(tok.Header())
				if h != "Bearer a" && h != "Bearer bb" {
					t.Errorf("read %q", h)
					return
				}
			}
		})
	}
	for i := range 1000 {
		tok.Set([]string{"a", "bb"}[i%2])
	}
	close(stop)
	wg.Wait()
}
