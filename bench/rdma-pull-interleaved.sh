# rdma-pull-interleaved.sh - guest commands, not a host script: Ferry's one-sided pull over rdma
# against ib_read_lat of the same 64 bytes, interleaved in rounds so that both see the same load.
# Run it inside the SoftRoCE guest:
#   bash ci/softroce-vm.sh --build-dir build --tests '' --cmd "$(cat bench/rdma-pull-interleaved.sh)"
# Prints per round: "IBREAD round N: p50 .. us p99 .. us" and "FERRY round N: p50 .. us p99 .. us".
MHZ=$(awk '/cpu MHz/{print $4; exit}' /proc/cpuinfo)
for i in 1 2 3 4 5; do
	ib_read_lat -d rxe0 -x 1 -s 64 -n 2000 -F -C -p 18600 >/dev/null 2>&1 &
	sleep 1
	ib_read_lat -d rxe0 -x 1 -s 64 -n 2000 -F -C -p 18600 10.77.0.1 2>&1 |
		awk -v m="$MHZ" -v r=$i '$1=="64"{printf "IBREAD round %s: p50 %.1f us p99 %.1f us\n", r, $5/m, $8/m}'
	wait
	FERRY_BIND_ADDR=10.77.0.1 ferry-microbench -R -r 3000 -l 2 -t rdma |
		awk -v r=$i '/pull\(rdma\) /{printf "FERRY round %s: p50 %.1f us p99 %.1f us\n", r, $5/1000, $6/1000}'
done
