# the agent's answer is in $EVALSI_ANSWER_FILE; its files in the working directory (the current one)
if [ "$(cat total.txt 2>/dev/null)" = "22" ]; then
  echo '{"passed": true, "score": 1}'
else
  echo '{"passed": false, "score": 0, "details": "total.txt is not 22"}'
fi
