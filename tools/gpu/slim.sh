#!/usr/bin/env bash
# Slims the tree that travels with every `run` call while the staging parts are carried, so that each part can be
# larger and fewer calls carry them (2026-11-30: a 47.9 MB tree left 17.1 MB a part, 99 calls of ~5 s held each; with
# the paths below set aside the tree is ~6 MB and a part ~58 MB).
#   bash tools/gpu/slim.sh hide      before the staging scripts (they size the parts from the tree as it is then)
#   bash tools/gpu/slim.sh weights   before the first call that runs more than `vllm_judge.sh install`: brings
#                                    back the shipped adapters' weights (`stage` merges them, evaluations read them)
#                                    and the loop runs' inputs/results.tar.xz (`vllm_judge.sh rejudge` reads them),
#                                    and keeps the other committed figures aside, which no call on the device reads (the
#                                    tree with them was 65 MB on 2026-12-01, too large beside .gpu-judge + .gpu-loop)
#   bash tools/gpu/slim.sh restore   everything back, here, before committing figures under SLIM_PATHS
#   bash tools/gpu/slim.sh status
# What is set aside (SLIM_PATHS in carry.sh: the shipped adapters' weights and the committed figures; none of them is
# read by `vllm_judge.sh install`) goes into .gpu-hidden/hidden.tar (ignored by git), and git is told to leave those
# paths alone (skip-worktree), so `git status` stays clean and `git add -A` or `git commit -a` cannot record them as
# deleted. Only committed, unchanged files are set aside: hide refuses while SLIM_PATHS hold changes or new files.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tools/gpu/carry.sh  # SLIM_PATHS, tree_bytes
H=.gpu-hidden
mb() { awk -v b="$1" 'BEGIN {printf "%.1f MB", b / 1e6}'; }

case "${1:?hide|weights|restore|status}" in
hide)
  [ ! -e "$H/hidden.tar" ] || { echo "slim: already hidden ($H/hidden.tar); bash tools/gpu/slim.sh restore first" >&2; exit 1; }
  changed=$(git status --porcelain --untracked-files=all -- "${SLIM_PATHS[@]}")
  [ -z "$changed" ] || { echo "slim: commit or move these first (only committed files are set aside):" >&2
                         echo "$changed" | head -n 10 >&2; exit 1; }
  ignore_here "$H"
  before=$(tree_bytes)
  mkdir -p "$H"
  git ls-files -z -- "${SLIM_PATHS[@]}" > "$H/files"
  [ -s "$H/files" ] || { rm -rf "$H"; echo "slim: nothing tracked under SLIM_PATHS"; exit 0; }
  xargs -0 git update-index --skip-worktree -- < "$H/files"
  tar -cf "$H/hidden.tar" --null -T "$H/files" --remove-files
  echo "slim: $(tr -cd '\0' < "$H/files" | wc -c) files set aside; the tree that travels: $(mb "$before") -> $(mb "$(tree_bytes)")"
  ;;
weights)
  [ -e "$H/hidden.tar" ] || { echo "slim: nothing hidden"; exit 0; }
  # only the weights come back, as ordinary tracked files again (what the `run` tool copies as it copies the whole
  # restored tree); the figures stay aside and skip-worktree until `restore`
  # and the loop runs' results archives (~3 MB in all; `vllm_judge.sh rejudge` judges their replies again)
  back='^(judge/adapters/[^/]*/adapter_model\.safetensors|docs/evaluations/compeer-loop/[^/]*/inputs/results\.tar\.xz)$'
  tr '\0' '\n' < "$H/files" | grep -E "$back" > "$H/back" || true
  tar -xf "$H/hidden.tar" -T "$H/back"
  xargs -r -d '\n' git update-index --no-skip-worktree -- < "$H/back"
  echo "slim: the adapters' weights and the loop's results archives are back, the figures still aside; the tree that travels: $(mb "$(tree_bytes)")"
  ;;
restore)
  [ -e "$H/hidden.tar" ] || { echo "slim: nothing hidden"; exit 0; }
  tar -xf "$H/hidden.tar"
  xargs -0 git update-index --no-skip-worktree -- < "$H/files"
  rm -rf "$H"
  git diff --quiet -- "${SLIM_PATHS[@]}" \
    || { echo "slim: restored, but these differ from the index (HEAD moved while they were hidden?):" >&2
         git diff --stat -- "${SLIM_PATHS[@]}" >&2; exit 1; }
  echo "slim: restored; the tree that travels: $(mb "$(tree_bytes)")"
  ;;
status)
  if [ -e "$H/hidden.tar" ]; then echo "hidden: $(tr -cd '\0' < "$H/files" | wc -c) files"; else echo "not hidden"; fi
  echo "the tree that travels: $(mb "$(tree_bytes)")"
  ;;
*)
  echo "usage: bash tools/gpu/slim.sh hide|weights|restore|status" >&2; exit 2
  ;;
esac
