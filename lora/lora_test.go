package lora

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHeldMergesEachOnceSorted(t *testing.T) {
	assert.Equal(t, []string{"a", "b", "c", "d"}, Held([]string{"c", "a"}, []string{"b", "a"}, []string{"d", "c"}))
	assert.Empty(t, Held(nil, nil, nil))
}

func TestResolve(t *testing.T) {
	var c Catalog
	assert.Equal(t, 0, c.AddAdapter("lora-0"))
	assert.Equal(t, 1, c.AddAdapter("lora-1"))
	assert.Equal(t, 0, c.AddAdapter("lora-0"), "an adapter keeps its number")
	assert.Equal(t, []string{"lora-0", "lora-1"}, c.Adapters())

	i, err := c.Resolve([]byte("lora-1"))
	require.NoError(t, err)
	assert.Equal(t, 1, i)
	i, err = c.Resolve(nil)
	assert.Equal(t, -1, i)
	assert.NoError(t, err)
	i, err = c.Resolve([]byte("base"))
	assert.Equal(t, -1, i)
	assert.NoError(t, err, "no worker has listed models yet: nothing to judge by")

	assert.Equal(t, 0, c.AddModel("base"))
	assert.Equal(t, 1, c.AddModel("other-base"))
	assert.Equal(t, 0, c.AddModel("base"), "a model added again keeps its number")
	m, ok := c.Model([]byte("other-base"))
	assert.True(t, ok)
	assert.Equal(t, 1, m)
	_, ok = c.Model([]byte("lora-1"))
	assert.False(t, ok, "an adapter is no base model")
	i, err = c.Resolve([]byte("base"))
	assert.Equal(t, -1, i)
	assert.NoError(t, err)
	_, err = c.Resolve([]byte("other"))
	var unknown *UnknownModelError
	require.ErrorAs(t, err, &unknown)
	assert.EqualError(t, err, `model "other" is neither a base model nor a LoRA adapter of any worker`)
	assert.Zero(t, testing.AllocsPerRun(100, func() { _, _ = c.Resolve([]byte("lora-1")) }))
	assert.Zero(t, testing.AllocsPerRun(100, func() { _, _ = c.Resolve([]byte("base")) }))
	assert.Zero(t, testing.AllocsPerRun(100, func() { _, _ = c.Model([]byte("base")) }))
}
