t0=$(date +%s)
killed=0
while true; do
  P=$(pgrep -f "agent-os: writer/log/0")
  now=$(( $(date +%s) - t0 ))
  if [ -n "$P" ]; then
    priv=$(awk '/^Private_(Clean|Dirty)/{s+=$2} END{print s}' /proc/$P/smaps_rollup 2>/dev/null)
    echo "$now $P $priv"
  fi
  if [ $killed = 0 ] && [ $now -ge 100 ]; then kill -9 $P; killed=1; echo "killed $P"; fi
  sleep 5
done
