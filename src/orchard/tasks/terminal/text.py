"""Terminal tasks about text processing: grep, sed, sort, columns, counting, CSV and logs."""

from orchard.tasks.terminal.spec import TerminalSpec as T

LOG = ("printf '%s\\n' '2024-05-01 10:00:01 INFO start' '2024-05-01 10:00:02 ERROR disk full' "
       "'2024-05-01 10:00:03 WARN slow' '2024-05-01 10:00:04 ERROR net down' '2024-05-01 10:00:05 INFO stop' > app.log")
CSV = ("printf '%s\\n' 'name,city,age' 'ann,paris,34' 'bob,rome,27' 'cid,paris,41' 'dan,oslo,19' 'eve,rome,52' "
       "> people.csv")

TASKS = [
    T("text-grep-errors", "Copy every line of /workspace/app.log that has the level ERROR into /workspace/errors.log, "
      "in the original order.",
      setup=LOG, solution="grep ' ERROR ' app.log > errors.log",
      checker="test \"$(cat errors.log)\" = \"$(printf '2024-05-01 10:00:02 ERROR disk full\\n"
              "2024-05-01 10:00:04 ERROR net down')\""),
    T("text-count-levels", "Count the lines per log level in /workspace/app.log and write them to "
      "/workspace/levels.txt as 'LEVEL COUNT' lines sorted by level name.",
      setup=LOG, solution="awk '{print $3}' app.log | sort | uniq -c | awk '{print $2, $1}' > levels.txt",
      checker="test \"$(cat levels.txt)\" = \"$(printf 'ERROR 2\\nINFO 2\\nWARN 1')\""),
    T("text-replace-word", "In /workspace/config.txt replace every occurrence of 'localhost' with '127.0.0.1', "
      "changing nothing else.",
      setup="printf 'host=localhost\\nurl=http://localhost:80/\\nname=localhostname\\n' > config.txt",
      solution="sed -i 's/localhost/127.0.0.1/g' config.txt",
      checker="test \"$(cat config.txt)\" = \"$(printf 'host=127.0.0.1\\nurl=http://127.0.0.1:80/\\n"
              "name=127.0.0.1name')\""),
    T("text-csv-column", "Write the names (first column) of the people in /workspace/people.csv who live in paris "
      "into /workspace/paris.txt, one per line, without the header.",
      setup=CSV, solution="awk -F, 'NR>1 && $2==\"paris\" {print $1}' people.csv > paris.txt",
      checker="test \"$(cat paris.txt)\" = \"$(printf 'ann\\ncid')\""),
    T("text-csv-average", "Write the average age of the people in /workspace/people.csv into /workspace/avg.txt, "
      "rounded to one decimal (e.g. 12.3).",
      setup=CSV, solution="awk -F, 'NR>1 {s+=$3; n++} END {printf \"%.1f\\n\", s/n}' people.csv > avg.txt",
      checker="test \"$(tr -d ' \\n' < avg.txt)\" = 34.6"),
    T("text-sort-numeric", "/workspace/scores.txt has 'name score' lines. Write them sorted by score, highest "
      "first, into /workspace/ranked.txt.",
      setup="printf '%s\\n' 'amy 7' 'ben 12' 'cat 3' 'dov 100' 'eli 25' > scores.txt",
      solution="sort -k2,2nr scores.txt > ranked.txt",
      checker="test \"$(awk '{print $1}' ranked.txt | tr '\\n' ' ')\" = 'dov eli ben amy cat '"),
    T("text-unique-words", "Write the distinct words of /workspace/words.txt (one word per line, case-sensitive), "
      "sorted alphabetically, into /workspace/unique.txt.",
      setup="printf '%s\\n' pear apple pear fig apple kiwi > words.txt",
      solution="sort -u words.txt > unique.txt",
      checker="test \"$(cat unique.txt)\" = \"$(printf 'apple\\nfig\\nkiwi\\npear')\""),
    T("text-strip-comments", "Remove every comment line (lines whose first non-blank character is #) and every "
      "blank line from /workspace/settings.conf, in place.",
      setup="printf '# top\\nalpha=1\\n\\n   # indented\\nbeta=2\\n\\ngamma=3 # trailing stays\\n' > settings.conf",
      solution="sed -i -e '/^[[:space:]]*#/d' -e '/^[[:space:]]*$/d' settings.conf",
      checker="test \"$(cat settings.conf)\" = \"$(printf 'alpha=1\\nbeta=2\\ngamma=3 # trailing stays')\""),
    T("text-top-ip", "/workspace/access.log is a web server log whose first field is the client IP. Write the IP "
      "with the most requests into /workspace/top_ip.txt.",
      setup="for ip in 10.0.0.1 10.0.0.2 10.0.0.2 10.0.0.3 10.0.0.2 10.0.0.1; do echo \"$ip - - GET /\"; done "
            "> access.log",
      solution="awk '{print $1}' access.log | sort | uniq -c | sort -rn | head -n1 | awk '{print $2}' > top_ip.txt",
      checker="test \"$(cat top_ip.txt)\" = 10.0.0.2"),
    T("text-join-files", "/workspace/ids.txt maps 'id name' and /workspace/emails.txt maps 'id email'. Write "
      "'name email' lines for every id present in both files into /workspace/contacts.txt, sorted by name.",
      setup="printf '1 ann\\n2 bob\\n3 cid\\n' > ids.txt && printf '3 cid@x.org\\n1 ann@x.org\\n4 dan@x.org\\n' "
            "> emails.txt",
      solution="join <(sort ids.txt) <(sort emails.txt) | awk '{print $2, $3}' | sort > contacts.txt",
      checker="test \"$(cat contacts.txt)\" = \"$(printf 'ann ann@x.org\\ncid cid@x.org')\""),
    T("text-line-numbers", "Write the line numbers (1-based) of the lines of /workspace/poem.txt that contain the "
      "word 'rose' (any case) into /workspace/lines.txt, one per line.",
      setup="printf 'A Rose\\nby any\\nother name\\nwould smell as sweet, rose\\nend\\n' > poem.txt",
      solution="grep -in 'rose' poem.txt | cut -d: -f1 > lines.txt",
      checker="test \"$(cat lines.txt)\" = \"$(printf '1\\n4')\""),
    T("text-upper-header", "Convert the first line (the header) of /workspace/data.tsv to upper case, in place, "
      "leaving the other lines unchanged.",
      setup="printf 'id\\tname\\n1\\tann\\n2\\tbob\\n' > data.tsv",
      solution="sed -i '1s/.*/\\U&/' data.tsv",
      checker="test \"$(cat data.tsv)\" = \"$(printf 'ID\\tNAME\\n1\\tann\\n2\\tbob')\""),
    T("text-json-field", "/workspace/users.jsonl has one JSON object per line. Write the 'email' of every user "
      "whose 'active' is true into /workspace/active.txt, one per line, in file order.",
      setup="printf '%s\\n' '{\"email\": \"a@x\", \"active\": true}' '{\"email\": \"b@x\", \"active\": false}' "
            "'{\"email\": \"c@x\", \"active\": true}' > users.jsonl",
      solution="python3 -c \"import json; [print(u['email']) for u in map(json.loads, open('users.jsonl')) "
               "if u['active']]\" > active.txt",
      checker="test \"$(cat active.txt)\" = \"$(printf 'a@x\\nc@x')\""),
    T("text-wrap-width", "Reformat /workspace/long.txt so that no line is longer than 20 characters, breaking only "
      "at spaces, and write the result to /workspace/wrapped.txt; the words and their order must not change.",
      setup="echo 'the quick brown fox jumps over the lazy dog and keeps running far away' > long.txt",
      solution="fold -s -w 20 long.txt | sed 's/ *$//' > wrapped.txt",
      checker="test \"$(awk 'length > 20' wrapped.txt | wc -l)\" = 0 && "
              "test \"$(tr -s ' \\n' ' ' < wrapped.txt | sed 's/ $//')\" = \"$(sed 's/ $//' long.txt)\""),
]
