package main

import (
	"os/exec"
	"syscall"
)

// setPdeathsig makes the kernel SIGKILL cmd when the demo dies, so a killed
// demo leaves no private redis-server behind.
func setPdeathsig(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
