package fielderr

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAnErrorNamesItsFieldAndReason(t *testing.T) {
	err := fmt.Errorf("wrapped: %w", New("model_mirrors[1].percent", "%v is not above 0", 0))
	var fe *Error
	require.True(t, errors.As(err, &fe))
	assert.Equal(t, Error{Field: "model_mirrors[1].percent", Reason: "0 is not above 0"}, *fe)
	assert.Equal(t, "model_mirrors[1].percent: 0 is not above 0", fe.Error())
}
