"""Terminal tasks about small scripts: write or fix a shell or Python program that behaves as asked."""

from orchard.tasks.terminal.spec import TerminalSpec as T

TASKS = [
    T("script-greet", "Write an executable bash script /workspace/greet.sh that prints 'Hello, NAME!' where NAME "
      "is its first argument, or 'Hello, world!' when it gets no argument.",
      setup="",
      solution="printf '#!/bin/bash\\necho \"Hello, ${1:-world}!\"\\n' > greet.sh && chmod +x greet.sh",
      checker="test -x greet.sh && test \"$(./greet.sh Ada)\" = 'Hello, Ada!' && "
              "test \"$(./greet.sh)\" = 'Hello, world!'"),
    T("script-sum-args", "Write an executable script /workspace/sum (any language available here) that prints the "
      "sum of its integer arguments (0 when there are none).",
      setup="",
      solution="printf '#!/usr/bin/env python3\\nimport sys\\nprint(sum(int(a) for a in sys.argv[1:]))\\n' > sum "
               "&& chmod +x sum",
      checker="test \"$(./sum 1 2 39)\" = 42 && test \"$(./sum)\" = 0 && test \"$(./sum -5 5 10)\" = 10"),
    T("script-fix-syntax", "The Python script /workspace/stats.py crashes. Fix it so that `python3 stats.py` prints "
      "the mean of the numbers in numbers.txt.",
      setup="printf '3\\n4\\n8\\n' > numbers.txt && printf 'nums = [float(x) for x in open(\"numbers.txt\")]\\n"
            "print(sum(nums) / len(num))\\n' > stats.py",
      solution="sed -i 's/len(num))/len(nums))/' stats.py",
      checker="test \"$(python3 stats.py)\" = 5.0"),
    T("script-fizzbuzz", "Write /workspace/fizzbuzz.py: `python3 fizzbuzz.py N` prints the numbers 1..N one per "
      "line, replacing multiples of 3 by Fizz, of 5 by Buzz and of both by FizzBuzz.",
      setup="",
      solution="printf 'import sys\\nfor i in range(1, int(sys.argv[1]) + 1):\\n    print(\"Fizz\" * (i %% 3 == 0) "
               "+ \"Buzz\" * (i %% 5 == 0) or i)\\n' > fizzbuzz.py",
      checker="out=$(python3 fizzbuzz.py 15 | tr '\\n' ' ') && "
              "test \"$out\" = '1 2 Fizz 4 Buzz Fizz 7 8 Fizz Buzz 11 Fizz 13 14 FizzBuzz '"),
    T("script-exit-code", "Write an executable bash script /workspace/check_file.sh that exits with status 0 when "
      "the path given as its first argument is an existing regular file and with status 3 otherwise.",
      setup="echo x > present.txt",
      solution="printf '#!/bin/bash\\n[ -f \"$1\" ] || exit 3\\n' > check_file.sh && chmod +x check_file.sh",
      checker="./check_file.sh present.txt && { ./check_file.sh missing.txt; test $? = 3; } && "
              "{ ./check_file.sh /workspace; test $? = 3; }"),
    T("script-env-default", "Write an executable bash script /workspace/port.sh that prints the value of the "
      "environment variable PORT, or 8000 when PORT is unset or empty.",
      setup="",
      solution="printf '#!/bin/bash\\necho \"${PORT:-8000}\"\\n' > port.sh && chmod +x port.sh",
      checker="test \"$(PORT=9 ./port.sh)\" = 9 && test \"$(env -u PORT ./port.sh)\" = 8000 && "
              "test \"$(PORT= ./port.sh)\" = 8000"),
    T("script-makefile", "Write /workspace/Makefile so that `make` builds the file hello.txt containing 'hello' "
      "and `make clean` removes it.",
      setup="",
      solution="printf 'hello.txt:\\n\\techo hello > hello.txt\\n\\nclean:\\n\\trm -f hello.txt\\n' > Makefile",
      checker="make -s >/dev/null && test \"$(cat hello.txt)\" = hello && make -s clean >/dev/null "
              "&& test ! -e hello.txt"),
    T("script-fix-test", "The function in /workspace/mathutil.py has a bug that makes `python3 test_mathutil.py` "
      "fail. Fix the function (do not change the test).",
      setup="printf 'def clamp(x, lo, hi):\\n    return max(lo, min(x, lo))\\n' > mathutil.py && printf "
            "'from mathutil import clamp\\nassert clamp(5, 0, 10) == 5\\nassert clamp(-1, 0, 10) == 0\\n"
            "assert clamp(11, 0, 10) == 10\\nprint(\"ok\")\\n' > test_mathutil.py && cp test_mathutil.py /tmp/.t",
      solution="sed -i 's/min(x, lo)/min(x, hi)/' mathutil.py",
      checker="cmp -s test_mathutil.py /tmp/.t && rm -rf __pycache__ && test \"$(python3 test_mathutil.py)\" = ok"),
    T("script-word-freq", "Write /workspace/freq.py: `python3 freq.py FILE` prints the three most frequent words "
      "of FILE (lower-cased, split on whitespace) as 'word count' lines, most frequent first, ties broken "
      "alphabetically.",
      setup="printf 'b a c b a B d a e c\\n' > sample.txt",
      solution="printf 'import sys, collections\\nc = collections.Counter(open(sys.argv[1]).read().lower().split())\\n"
               "for w, n in sorted(c.items(), key=lambda p: (-p[1], p[0]))[:3]:\\n    print(w, n)\\n' > freq.py",
      checker="test \"$(python3 freq.py sample.txt)\" = \"$(printf 'a 3\\nb 3\\nc 2')\""),
    T("script-backup", "Write an executable bash script /workspace/backup.sh that copies every .conf file from the "
      "folder given as first argument into the folder given as second argument (creating it if needed), "
      "appending .bak to each copied name.",
      setup="mkdir etc && echo a > etc/a.conf && echo b > etc/b.conf && echo x > etc/skip.txt",
      solution="printf '#!/bin/bash\\nmkdir -p \"$2\"\\nfor f in \"$1\"/*.conf; do cp \"$f\" \"$2/$(basename \"$f\")"
               ".bak\"; done\\n' > backup.sh && chmod +x backup.sh",
      checker="./backup.sh etc bk && test \"$(ls bk | tr '\\n' ' ')\" = 'a.conf.bak b.conf.bak ' && "
              "test \"$(cat bk/b.conf.bak)\" = b"),
    T("script-json-report", "Write /workspace/report.py: `python3 report.py` reads orders.csv (columns item,qty,price) "
      "and writes total.json holding {\"total\": <sum of qty*price>} as JSON.",
      setup="printf 'item,qty,price\\npen,3,1.5\\nbook,2,12\\ncup,1,4.5\\n' > orders.csv",
      solution="printf 'import csv, json\\nrows = csv.DictReader(open(\"orders.csv\"))\\njson.dump({\"total\": "
               "sum(int(r[\"qty\"]) * float(r[\"price\"]) for r in rows)}, open(\"total.json\", \"w\"))\\n' "
               "> report.py",
      checker="rm -f total.json && python3 report.py && python3 -c \"import json; "
              "assert abs(json.load(open('total.json'))['total'] - 33.0) < 1e-9\""),
    T("script-retry", "Write an executable bash script /workspace/retry.sh: `./retry.sh N CMD...` runs CMD up to N "
      "times until it succeeds, exiting 0 on the first success and 1 if every attempt failed.",
      setup="printf '#!/bin/bash\\nn=$(cat /tmp/.count 2>/dev/null || echo 0); n=$((n+1)); echo $n > /tmp/.count;"
            " [ $n -ge 3 ]\\n' > flaky.sh && chmod +x flaky.sh",
      solution="printf '#!/bin/bash\\nn=$1; shift\\nfor i in $(seq \"$n\"); do \"$@\" && exit 0; done\\nexit 1\\n' "
               "> retry.sh && chmod +x retry.sh",
      checker="rm -f /tmp/.count && ./retry.sh 5 ./flaky.sh && test \"$(cat /tmp/.count)\" = 3 && "
              "rm -f /tmp/.count && { ./retry.sh 2 ./flaky.sh; test $? = 1; } && ./retry.sh 1 true"),
]
