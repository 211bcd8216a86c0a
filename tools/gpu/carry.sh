# Sourced by the staging scripts (stage.sh, stage_qwen.sh, stage_vllm.sh): how large a carry folder may be. A `run`
# call takes at most 64 MiB: the tree that travels (tracked files and untracked ones git does not ignore) plus the
# carried folders; one part a call fits beside the tree with 2 MiB to spare.
tree_bytes() {  # the bytes of the tree that travels with every call (a tracked file deleted here counts nothing)
  git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}'
  return 0
}
CALL_BYTES=$(( 64 * 1048576 ))  # what one call carries, the tree included
part_bytes() {  # PART_BYTES if set, else a call less the tree ($1, else counted here) and 2 MiB
  echo "${PART_BYTES:-$(( CALL_BYTES - ${1:-$(tree_bytes)} - 2 * 1048576 ))}"
}
