"""Terminal tasks about git: commits, branches, merges, history, ignore rules and tags."""

from orchard.tasks.terminal.spec import TerminalSpec as T

ID = "export GIT_AUTHOR_NAME=dev GIT_AUTHOR_EMAIL=dev@example.com GIT_COMMITTER_NAME=dev " \
     "GIT_COMMITTER_EMAIL=dev@example.com"
REPO = (f"{ID} && mkdir repo && cd repo && git init -q -b main && echo one > a.txt && git add a.txt && "
        "git commit -qm 'first' && echo two >> a.txt && git commit -qam 'second'")
CFG = "git config --global user.name dev && git config --global user.email dev@example.com"

TASKS = [
    T("git-init-commit", "Turn /workspace/app into a git repository (branch main) and commit all its files in one "
      "commit with the message 'initial import'.",
      setup=f"{CFG} && mkdir app && echo 'print(1)' > app/main.py && echo '# app' > app/README.md",
      solution="cd app && git init -q -b main && git add -A && git commit -qm 'initial import'",
      checker="cd app && test \"$(git log --format=%s)\" = 'initial import' && "
              "test \"$(git ls-files | sort | tr '\\n' ' ')\" = 'README.md main.py ' && test -z \"$(git status --porcelain)\""),
    T("git-branch-commit", "In /workspace/repo create a branch named feature from main, and on it commit a new file "
      "feature.txt containing 'wip'. main must stay unchanged.",
      setup=f"{CFG} && {REPO}",
      solution="cd repo && git checkout -qb feature && echo wip > feature.txt && git add feature.txt && "
               "git commit -qm 'add feature'",
      checker="cd repo && test \"$(git show feature:feature.txt)\" = wip && test \"$(git rev-list --count main)\" = 2 "
              "&& ! git cat-file -e main:feature.txt 2>/dev/null"),
    T("git-amend-message", "The last commit in /workspace/repo has the message 'second'. Change its message to "
      "'append two to a.txt' without changing its content.",
      setup=f"{CFG} && {REPO}",
      solution="cd repo && git commit -q --amend -m 'append two to a.txt'",
      checker="cd repo && test \"$(git log -1 --format=%s)\" = 'append two to a.txt' && "
              "test \"$(git rev-list --count HEAD)\" = 2 && test \"$(git show HEAD:a.txt)\" = \"$(printf 'one\\ntwo')\""),
    T("git-gitignore", "In /workspace/repo make git ignore every .log file and the folder build/, and commit the "
      "ignore rules in a .gitignore file.",
      setup=f"{CFG} && {REPO} && mkdir build && touch build/out.o debug.log",
      solution="cd repo && printf '*.log\\nbuild/\\n' > .gitignore && git add .gitignore && git commit -qm 'ignore'",
      checker="cd repo && git check-ignore -q debug.log && git check-ignore -q build/out.o && "
              "git cat-file -e HEAD:.gitignore && test -z \"$(git status --porcelain)\""),
    T("git-merge", "In /workspace/repo merge the branch topic into main (main must end up containing topic.txt).",
      setup=f"{CFG} && {REPO} && git checkout -qb topic && echo t > topic.txt && git add topic.txt && "
            "git commit -qm topic && git checkout -q main && echo m > main.txt && git add main.txt && git commit -qm main",
      solution="cd repo && git merge -q --no-edit topic",
      checker="cd repo && test \"$(git branch --show-current)\" = main && git cat-file -e main:topic.txt && "
              "git cat-file -e main:main.txt && git merge-base --is-ancestor topic main"),
    T("git-resolve-conflict", "In /workspace/repo a merge of branch other into main stopped with a conflict in "
      "a.txt. Resolve it so that a.txt holds the three lines one, two, three (in that order) and finish the merge.",
      setup=f"{CFG} && {REPO} && git checkout -qb other HEAD~1 && printf 'one\\nthree\\n' > a.txt && "
            "git commit -qam other && git checkout -q main && (git merge other >/dev/null 2>&1 || true)",
      solution="cd repo && printf 'one\\ntwo\\nthree\\n' > a.txt && git add a.txt && git commit -q --no-edit",
      checker="cd repo && test ! -e .git/MERGE_HEAD && test \"$(git show HEAD:a.txt)\" = \"$(printf 'one\\ntwo\\nthree')\" "
              "&& git merge-base --is-ancestor other HEAD && test -z \"$(git status --porcelain)\""),
    T("git-revert", "The last commit of /workspace/repo broke a.txt. Undo it with a new commit (do not rewrite "
      "history).",
      setup=f"{CFG} && {REPO} && echo broken > a.txt && git commit -qam 'oops'",
      solution="cd repo && git revert --no-edit HEAD >/dev/null",
      checker="cd repo && test \"$(git rev-list --count HEAD)\" = 4 && "
              "test \"$(git show HEAD:a.txt)\" = \"$(printf 'one\\ntwo')\" && git log --format=%s | grep -qx oops"),
    T("git-tag", "Tag the commit with message 'first' in /workspace/repo with an annotated tag v0.1 whose message is "
      "'first release'.",
      setup=f"{CFG} && {REPO}",
      solution="cd repo && git tag -a v0.1 -m 'first release' \"$(git log --format=%H --grep='^first$')\"",
      checker="cd repo && test \"$(git cat-file -t v0.1)\" = tag && "
              "test \"$(git log -1 --format=%s v0.1)\" = first && "
              "test \"$(git tag -l --format='%(contents:subject)' v0.1)\" = 'first release'"),
    T("git-find-author", "Write the email address of the author who made the most commits in /workspace/repo into "
      "/workspace/author.txt.",
      setup=f"{CFG} && mkdir repo && cd repo && git init -q && for a in x y y z y x; do "
            "echo $a >> f && git add f && GIT_AUTHOR_NAME=$a GIT_AUTHOR_EMAIL=$a@corp.com git commit -qm \"by $a\"; done",
      solution="git -C repo log --format=%ae | sort | uniq -c | sort -rn | head -n1 | awk '{print $2}' > author.txt",
      checker="test \"$(cat author.txt)\" = y@corp.com"),
    T("git-unstage", "In /workspace/repo the file secret.env was staged by mistake together with notes.txt. Commit "
      "only notes.txt (message 'notes'); secret.env must stay in the folder, uncommitted.",
      setup=f"{CFG} && {REPO} && echo KEY=1 > secret.env && echo hi > notes.txt && git add secret.env notes.txt",
      solution="cd repo && git restore --staged secret.env && git commit -qm notes",
      checker="cd repo && git cat-file -e HEAD:notes.txt && ! git cat-file -e HEAD:secret.env 2>/dev/null && "
              "test -f secret.env && test \"$(git log -1 --format=%s)\" = notes"),
    T("git-cherry-pick", "In /workspace/repo the branch fixes has a commit with message 'fix typo'. Apply just that "
      "commit onto main (main must not get the other commits of fixes).",
      setup=f"{CFG} && {REPO} && git checkout -qb fixes && echo x > x.txt && git add x.txt && git commit -qm 'add x' "
            "&& sed -i 's/two/TWO/' a.txt && git commit -qam 'fix typo' && git checkout -q main",
      solution="cd repo && git cherry-pick \"$(git log fixes --format=%H --grep='^fix typo$')\" >/dev/null",
      checker="cd repo && test \"$(git branch --show-current)\" = main && "
              "test \"$(git show main:a.txt)\" = \"$(printf 'one\\nTWO')\" && ! git cat-file -e main:x.txt 2>/dev/null"),
    T("git-changed-files", "Write the paths of the files changed between the tags v1 and v2 of /workspace/repo into "
      "/workspace/changed.txt, sorted, one per line.",
      setup=f"{CFG} && mkdir repo && cd repo && git init -q && echo a > a && echo b > b && echo c > c && git add . && "
            "git commit -qm 1 && git tag v1 && echo b2 > b && echo d > d && git add . && git commit -qm 2 && "
            "echo c2 > c && git commit -qam 3 && git tag v2",
      solution="git -C repo diff --name-only v1 v2 | sort > changed.txt",
      checker="test \"$(cat changed.txt)\" = \"$(printf 'b\\nc\\nd')\""),
    T("git-stash-branch", "/workspace/repo has uncommitted edits to a.txt on main. Move them onto a new branch "
      "named wip as a commit (any message), leaving main's last commit and working tree clean.",
      setup=f"{CFG} && {REPO} && echo three >> a.txt",
      solution="cd repo && git checkout -qb wip && git commit -qam wip && git checkout -q main",
      checker="cd repo && test \"$(git show wip:a.txt)\" = \"$(printf 'one\\ntwo\\nthree')\" && "
              "test \"$(git show main:a.txt)\" = \"$(printf 'one\\ntwo')\" && "
              "test -z \"$(git status --porcelain --untracked-files=no)\""),
]
