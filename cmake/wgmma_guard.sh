#!/bin/sh
# Compiler launcher of the sm_90a kernels: runs the compile command and fails it when ptxas
# reports that it serialised a kernel's wgmma instructions (C7514 / C7515: a non-wgmma
# instruction reads or writes an accumulator register while ptxas cannot prove its wgmma group
# retired; C7520: a branch ptxas cannot tell uniform lies between wgmma). Such a kernel is
# correct but waits for every product before issuing the next, which costs a quarter to a third
# of its speed.
log=$(mktemp) || exit 1
"$@" 2> "$log"
status=$?
cat "$log" >&2
if grep -q "wgmma.mma_async instructions are serialized" "$log"; then
  echo "error: ptxas serialised the wgmma instructions of a kernel in this unit (see above)" >&2
  status=1
fi
rm -f "$log"
exit $status
