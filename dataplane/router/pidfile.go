package router

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
)

// A reload moves pid_file as nginx moves its pid file: this process's id
// is written to the new path (writePIDFile), then the file at the old one
// is removed if it holds this process's id (removeOwnPIDFile). The
// serving process first wrote its pid_file once it served (tableflip's
// Ready); an upgrade's new process writes the path of the config it reads.

// pid is this process's id as a pid file holds it.
func pid() []byte { return []byte(strconv.Itoa(os.Getpid())) }

// writePIDFile writes this process's id to path whole (writeWhole).
func writePIDFile(path string) error {
	if err := writeWhole(path, pid()); err != nil {
		return fmt.Errorf("key pid_file: %w", err)
	}
	return nil
}

// removeOwnPIDFile removes the file at path if it holds this process's id:
// another's, as an upgrade's new process writes its own, stays. A path
// that holds no file is no error.
func removeOwnPIDFile(path string) error {
	held, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case !bytes.Equal(bytes.TrimSpace(held), pid()):
		return nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
