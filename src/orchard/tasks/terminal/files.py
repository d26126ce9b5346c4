"""Terminal tasks about files and folders: create, move, find, archive, permissions."""

from orchard.tasks.terminal.spec import TerminalSpec as T

TASKS = [
    T("files-mkdir-tree", "Create the folders project/src, project/tests and project/docs under /workspace, "
      "and an empty file project/README.md.",
      setup="",
      solution="mkdir -p project/src project/tests project/docs && touch project/README.md",
      checker="test -d project/src && test -d project/tests && test -d project/docs && test -f project/README.md"),
    T("files-rename-ext", "In /workspace/notes, rename every file ending in .txt so it ends in .md instead. "
      "Leave other files alone.",
      setup="mkdir notes && for n in a b c; do echo $n > notes/$n.txt; done && echo keep > notes/keep.log",
      solution="cd notes && for f in *.txt; do mv \"$f\" \"${f%.txt}.md\"; done",
      checker="cd notes && test \"$(ls | sort | tr '\\n' ' ')\" = 'a.md b.md c.md keep.log ' && "
              "test \"$(cat b.md)\" = b"),
    T("files-find-large", "Some files under /workspace/data are bigger than 10 KiB. Write their paths, relative to "
      "/workspace and sorted, one per line, into /workspace/large.txt.",
      setup="mkdir -p data/x data/y && head -c 20000 /dev/zero > data/x/big1 && head -c 500 /dev/zero > data/x/small "
            "&& head -c 12000 /dev/zero > data/y/big2 && head -c 10 /dev/zero > data/y/tiny",
      solution="find data -type f -size +10k | sort > large.txt",
      checker="test \"$(cat large.txt)\" = \"$(printf 'data/x/big1\\ndata/y/big2')\""),
    T("files-delete-empty", "Delete every empty file under /workspace/tree (non-empty files must stay).",
      setup="mkdir -p tree/a/b && touch tree/e1 tree/a/e2 tree/a/b/e3 && echo x > tree/a/full && echo y > tree/keep",
      solution="find tree -type f -empty -delete",
      checker="test -z \"$(find tree -type f -empty)\" && test -s tree/a/full && test -s tree/keep"),
    T("files-tar-archive", "Pack the folder /workspace/site into a gzip-compressed tar archive /workspace/site.tar.gz "
      "whose entries start with site/.",
      setup="mkdir -p site/css && echo '<h1>hi</h1>' > site/index.html && echo 'body{}' > site/css/main.css",
      solution="tar czf site.tar.gz site",
      checker="tar tzf site.tar.gz | grep -qx 'site/index.html' && tar tzf site.tar.gz | grep -qx 'site/css/main.css'"),
    T("files-extract-one", "The archive /workspace/bundle.tar.gz contains many files. Extract only config/app.ini "
      "into /workspace/out (so that /workspace/out/config/app.ini exists) and nothing else.",
      setup="mkdir -p b/config b/data && echo 'port=8080' > b/config/app.ini && echo junk > b/data/x && "
            "tar czf bundle.tar.gz -C b . && rm -rf b",
      solution="mkdir -p out && tar xzf bundle.tar.gz -C out ./config/app.ini",
      checker="grep -qx 'port=8080' out/config/app.ini && test ! -e out/data"),
    T("files-chmod-scripts", "Make every .sh file under /workspace/bin executable by its owner; other files must "
      "not become executable.",
      setup="mkdir bin && printf '#!/bin/sh\\necho a\\n' > bin/a.sh && printf '#!/bin/sh\\necho b\\n' > bin/b.sh "
            "&& echo data > bin/notes.txt && chmod 644 bin/*",
      solution="chmod u+x bin/*.sh",
      checker="test -x bin/a.sh && test -x bin/b.sh && test ! -x bin/notes.txt"),
    T("files-symlink", "Create a symbolic link /workspace/current that points to the folder release-2 "
      "(a relative link).",
      setup="mkdir release-1 release-2 && echo 2 > release-2/VERSION",
      solution="ln -s release-2 current",
      checker="test -L current && test \"$(readlink current)\" = release-2 && test \"$(cat current/VERSION)\" = 2"),
    T("files-dedupe", "/workspace/photos holds some files with identical content. Delete duplicates so that each "
      "distinct content remains exactly once, keeping the alphabetically first name of each group.",
      setup="mkdir photos && echo A > photos/a1 && echo A > photos/a2 && echo B > photos/b1 && echo A > photos/c3 "
            "&& echo B > photos/d4 && echo C > photos/e5",
      solution="cd photos && for f in $(ls | sort); do test -e \"$f\" || continue; for g in $(ls | sort); do "
               "[ \"$g\" \\> \"$f\" ] && cmp -s \"$f\" \"$g\" && rm \"$g\"; done; done; true",
      checker="test \"$(ls photos | tr '\\n' ' ')\" = 'a1 b1 e5 '"),
    T("files-count-lines", "Write the total number of lines of all .py files under /workspace/src (recursively) "
      "into /workspace/count.txt, as a bare number.",
      setup="mkdir -p src/pkg && printf 'a\\nb\\nc\\n' > src/one.py && printf 'x\\ny\\n' > src/pkg/two.py "
            "&& printf '1\\n2\\n3\\n4\\n' > src/pkg/skip.txt",
      solution="find src -name '*.py' -exec cat {} + | wc -l > count.txt",
      checker="test \"$(tr -d ' \\n' < count.txt)\" = 5"),
    T("files-copy-structure", "Copy only the folder structure of /workspace/src (all folders, no files) to "
      "/workspace/skeleton.",
      setup="mkdir -p src/a/b src/c && echo 1 > src/a/f && echo 2 > src/a/b/g",
      solution="cd src && find . -type d -exec mkdir -p ../skeleton/{} \\;",
      checker="test -d skeleton/a/b && test -d skeleton/c && test -z \"$(find skeleton -type f)\""),
    T("files-newest", "Write the name (not the path) of the most recently modified file in /workspace/logs "
      "into /workspace/newest.txt.",
      setup="mkdir logs && for i in 1 2 3; do echo $i > logs/app-$i.log; done && touch -d '2024-01-01' logs/app-1.log "
            "&& touch -d '2024-03-01' logs/app-3.log && touch -d '2024-02-01' logs/app-2.log",
      solution="ls -t logs | head -n1 > newest.txt",
      checker="test \"$(cat newest.txt)\" = app-3.log"),
    T("files-move-by-ext", "Sort the files in /workspace/inbox into subfolders of /workspace/inbox named after "
      "their extension (e.g. inbox/pdf/report.pdf). Files without an extension stay where they are.",
      setup="mkdir inbox && touch inbox/report.pdf inbox/photo.jpg inbox/scan.pdf inbox/README",
      solution="cd inbox && for f in *.*; do e=\"${f##*.}\"; mkdir -p \"$e\"; mv \"$f\" \"$e/\"; done",
      checker="test -f inbox/pdf/report.pdf && test -f inbox/pdf/scan.pdf && test -f inbox/jpg/photo.jpg "
              "&& test -f inbox/README"),
]
