# runs in the attempt's fresh working directory, before the agent
printf "Ada\n" > name.txt
