"""evalsi's Grafana dashboards as code: a module per dashboard, and the SQL (`sql`) and panel builders (`panels`)
they share. `deploy/grafana/dashboards.py` renders them to JSON."""
