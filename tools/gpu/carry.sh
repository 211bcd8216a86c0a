# Sourced by the staging scripts (stage.sh, stage_qwen.sh, stage_vllm.sh): how large a carry folder may be. A `run`
# call takes at most 64 MiB: the tree that travels (tracked files and untracked ones git does not ignore) plus the
# carried folders; one part a call fits beside the tree with 2 MiB to spare. Sizes are disk usage (whole blocks), not
# the files' lengths: on 2026-11-30 a wheel folder of 20.5 MB beside a 46.2 MB tree (63.6 MiB of lengths, 65.2 MiB of
# blocks over 739 files) was refused.
tree_bytes() {  # the disk usage of the tree that travels with every call (a tracked file deleted here counts nothing)
  git ls-files -z --cached --others --exclude-standard | du -c -B1 --files0-from=- 2>/dev/null | awk 'END {print $1 + 0}'
  return 0
}
folder_bytes() {  # the disk usage of one carry folder ($1)
  du -s -B1 "$1" | cut -f1
}
# What tools/gpu/slim.sh sets aside while parts are carried: the shipped adapters' weights and the committed figures
# (none is read by `vllm_judge.sh install`); git pathspecs.
SLIM_PATHS=(':(glob)judge/adapters/*/adapter_model.safetensors' docs/runs docs/evaluations)
ignore_here() {  # ignore_here DIR: git ignores the staging folder /DIR/ in this checkout (.git/info/exclude; in a
  # worktree the main repository's, which worktrees share), once
  local x; x=$(git rev-parse --git-path info/exclude)
  grep -qx "/$1/" "$x" 2>/dev/null || { mkdir -p "$(dirname "$x")"; echo "/$1/" >> "$x"; }
}
CALL_BYTES=$(( 64 * 1048576 ))  # what one call carries, the tree included
part_bytes() {  # PART_BYTES if set, else a call less the tree ($1, else counted here) and 2 MiB
  echo "${PART_BYTES:-$(( CALL_BYTES - ${1:-$(tree_bytes)} - 2 * 1048576 ))}"
}
