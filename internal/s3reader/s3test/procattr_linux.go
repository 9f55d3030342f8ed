package s3test

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the gateway exit when the process that started it does, even on a crash.
func dieWithParent(cmd *exec.Cmd) { cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
