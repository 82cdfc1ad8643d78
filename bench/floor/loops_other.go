//go:build !linux

package floor

import (
	"errors"
	"net"
)

func startEpoll(*net.TCPListener, []string) (func(), error) {
	return nil, errors.New("floor: the epoll model runs on Linux only")
}

func startCoroutines(*net.TCPListener, []string) (func(), error) {
	return nil, errors.New("floor: the coroutines model runs on Linux only")
}
