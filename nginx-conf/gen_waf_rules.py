#!/usr/bin/env python3
"""Writes nginx-conf/waf_rules.lua, the rules of the example WAF (waf.lua).

    python3 nginx-conf/gen_waf_rules.py > nginx-conf/waf_rules.lua

The rules are PCRE patterns for ngx.re.find(subject, pattern, "jo"); case
folding is in the pattern, as (?i). Families of attacks get ids in their own
range (ID_BASE); most families are a list of names (SQL functions, HTML event
handlers, shell commands, files worth stealing, scanner names) crossed with
the contexts an attack puts them in. The output is plain data: review and
edit it as such, or change this script and run it again.

Targets say what a rule looks at (see waf.lua): "uri" (the decoded path),
"args" (query argument names and values), "body" (the decoded body),
"headers" (all header values), "user_agent".
"""

import re

ID_BASE = {
    "sqli": 10000,
    "xss": 20000,
    "traversal": 30000,
    "rce": 40000,
    "scanner": 50000,
    "rfi": 60000,
    "probe": 70000,
    "misc": 80000,
}

INPUT = ["args", "body", "headers"]
PATHISH = ["uri", "args", "body"]

rules = []
counters = dict.fromkeys(ID_BASE, 0)


def rule(family, pattern, msg, targets=INPUT):
    counters[family] += 1
    assert counters[family] < 10000, family
    rules.append((ID_BASE[family] + counters[family], pattern, targets, msg))


def word(name):
    """A name as a regex: literal, with any run of spaces for a space."""
    return re.escape(name).replace("\\ ", r"\s+")


# --- SQL injection -------------------------------------------------------

SQLI_CORE = [
    (r"(?i)\bunion\b[\s(/*]+(?:all\s+|distinct\s+)?select\b", "UNION SELECT"),
    (r"(?i)'\s*(?:or|and|xor|\|\||&&)\s*'?\d+'?\s*(?:=|<|>|<>|!=|\blike\b)\s*'?\d+",
     "quote then numeric tautology"),
    (r"(?i)'\s*(?:or|and|xor)\s*'[^']*'\s*(?:=|<>|!=|\blike\b)\s*'", "quote then string tautology"),
    (r"(?i)\b(?:or|and)\s+\d+\s*=\s*\d+\s*(?:--|#|/\*|;|$)", "numeric tautology then comment"),
    (r"(?i)\b(?:or|and)\s+true\s*(?:--|#|/\*)", "OR TRUE then comment"),
    (r"'\s*(?:--|#|/\*)", "quote then SQL comment"),
    (r"(?i)\binformation_schema\b", "information_schema access"),
    (r"(?i)\b(?:sysobjects|syscolumns|sys\.tables|sys\.columns|mysql\.user|"
     r"pg_catalog|pg_shadow|pg_user|sqlite_master|all_tables|user_tables|dba_users)\b",
     "system catalog access"),
    (r"(?i)\binto\s+(?:out|dump)file\b", "INTO OUTFILE"),
    (r"(?i)\bload\s+data\s+(?:local\s+)?infile\b", "LOAD DATA INFILE"),
    (r"(?i)\bwaitfor\s+(?:delay|time)\s+'", "WAITFOR DELAY"),
    (r"/\*!\d*", "MySQL versioned comment"),
    (r"(?i)\bexec(?:ute)?\s+(?:master\.\.)?(?:xp|sp)_\w+", "EXEC of a stored procedure"),
    (r"(?i)\b(?:xp_cmdshell|sp_executesql|sp_oacreate|sp_oamethod|xp_regread|xp_dirtree|"
     r"xp_fileexist|sp_makewebtask|sp_addlogin|sp_password)\b", "dangerous stored procedure"),
    (r"(?i)\border\s+by\s+\d+\s*(?:--|#|/\*)", "ORDER BY column probing"),
    (r"(?i)\bgroup\s+by\s+.{1,60}\bhaving\b\s+\d+\s*=\s*\d+", "GROUP BY ... HAVING probing"),
    (r"(?i)\b(?:select|union|where|and|or)\b.{0,40}\b0x[0-9a-f]{6,}", "hex literal in SQL"),
    (r"(?i)\bchar\s*\(\s*\d+\s*(?:,\s*\d+\s*){2,}\)", "CHAR() string building"),
    (r"(?i)\bconcat(?:_ws)?\s*\(.{0,80}(?:\bselect\b|0x|\bchar\s*\()", "CONCAT with subquery"),
    (r"(?i)\b(?:union|select|from|where|and|or)\s*/\*.*?\*/\s*(?:select|from|where|and|or|union)\b",
     "keywords split by comments"),
    (r"(?i)\bselect\b.{1,100}\bfrom\b.{1,100}\bwhere\b.{1,100}(?:=|\blike\b)", "SELECT ... FROM ... WHERE"),
    (r"(?i)\bcase\s+when\s+.{1,80}\bthen\b.{1,80}\belse\b.{1,80}\bend\b", "CASE WHEN blind injection"),
    (r"(?i)\b(?:if|iif)\s*\(\s*(?:\d+\s*[=<>]|ascii|substr|mid|length|ord)", "conditional blind injection"),
    (r"(?i)'\s*\+\s*'|'\s*\|\|\s*'", "string concatenation after a quote"),
    (r"(?i)\bselect\s+(?:@@|\w+\s*\(\s*\))", "SELECT of a function or variable"),
    (r"(?i)@@(?:version|datadir|hostname|basedir|tmpdir|servername)\b", "server variable"),
    (r"(?i)\bdeclare\s+@\w+\s", "DECLARE @variable"),
    (r"(?i)\b(?:procedure\s+analyse|limit\s+\d+\s*,\s*\d+\s*(?:--|#|into))", "LIMIT/ANALYSE probing"),
    (r"(?i)'\s*\)\s*(?:or|and)\s*\(\s*'", "closing parenthesis then boolean"),
    (r"(?i)\)\s*(?:or|and)\s+\d+\s*=\s*\d+", "parenthesis then tautology"),
]

SQL_FUNCTIONS = [
    "sleep", "benchmark", "pg_sleep", "load_file", "extractvalue", "updatexml", "version",
    "database", "user", "current_user", "system_user", "session_user", "schema",
    "group_concat", "concat", "concat_ws", "char", "chr", "ascii", "ord", "substring",
    "substr", "mid", "hex", "unhex", "md5", "sha1", "length", "ifnull", "coalesce",
    "cast", "convert", "count", "exp", "floor", "rand", "name_const", "geometrycollection",
    "polygon", "multipoint", "linestring", "utl_inaddr.get_host_name",
    "dbms_pipe.receive_message", "ctxsys.drithsx.sn", "xmltype", "randomblob",
    "sqlite_version", "pg_read_file", "lo_import", "dbms_lock.sleep", "json_keys",
    "row_count", "found_rows", "connection_id", "last_insert_id",
]

SQL_FUNCTION_CONTEXTS = [
    (r"(?i)['\")\d]\s*(?:and|or|xor|&&|\|\|)\s*{fn}\s*\(", "boolean with {fn}()"),
    (r"(?i)\bunion\b.{{0,100}}\b{fn}\s*\(", "UNION with {fn}()"),
    (r"(?i)\bselect\s+(?:.{{0,60}},\s*)?{fn}\s*\(", "SELECT {fn}()"),
    (r"(?i)['\d)]\s*;\s*select\s+{fn}\s*\(", "stacked SELECT {fn}()"),
]

SQL_STATEMENTS = [
    (r"drop\s+(?:table|database|schema|user|view|index)", "DROP"), (r"delete\s+from", "DELETE"),
    (r"insert\s+into", "INSERT"), (r"update\s+\w+\s+set", "UPDATE"),
    (r"create\s+(?:table|user|database|function|procedure|trigger)", "CREATE"),
    (r"alter\s+(?:table|user|database)", "ALTER"), (r"truncate\s+table", "TRUNCATE"),
    (r"exec(?:ute)?\s", "EXEC"), (r"declare\s", "DECLARE"), (r"shutdown\b", "SHUTDOWN"),
    (r"grant\s", "GRANT"), (r"revoke\s", "REVOKE"), (r"rename\s+table", "RENAME"),
    (r"load\s+data", "LOAD DATA"), (r"handler\s+\w+\s+open", "HANDLER"), (r"call\s+\w+", "CALL"),
    (r"lock\s+tables", "LOCK TABLES"), (r"set\s+@", "SET"), (r"select\s", "SELECT"),
    (r"copy\s+\w+\s+(?:from|to)", "COPY"),
]

SQL_STACK_CONTEXTS = [
    (r"(?i)'\s*;\s*{st}", "quote"),
    (r"(?i)\d\s*;\s*{st}", "number"),
    (r"(?i)\)\s*;\s*{st}", "parenthesis"),
]

# --- XSS -----------------------------------------------------------------

EVENT_HANDLERS = """
onabort onafterprint onanimationcancel onanimationend onanimationiteration onanimationstart
onauxclick onbeforecopy onbeforecut onbeforeinput onbeforepaste onbeforeprint onbeforeunload
onbegin onblur oncanplay oncanplaythrough onchange onclick onclose oncontextmenu oncopy
oncuechange oncut ondblclick ondrag ondragend ondragenter ondragexit ondragleave ondragover
ondragstart ondrop ondurationchange onemptied onend onended onerror onfocus onfocusin
onfocusout onformdata onfullscreenchange onfullscreenerror ongotpointercapture onhashchange
oninput oninvalid onkeydown onkeypress onkeyup onload onloadeddata onloadedmetadata
onloadend onloadstart onlostpointercapture onmessage onmousedown onmouseenter onmouseleave
onmousemove onmouseout onmouseover onmouseup onmousewheel onoffline ononline onpagehide
onpageshow onpaste onpause onplay onplaying onpointercancel onpointerdown onpointerenter
onpointerleave onpointermove onpointerout onpointerover onpointerup onpopstate onprogress
onratechange onrepeat onreset onresize onscroll onsearch onsecuritypolicyviolation onseeked
onseeking onselect onselectionchange onselectstart onshow onslotchange onstalled onstorage
onsubmit onsuspend ontimeupdate ontoggle ontouchcancel ontouchend ontouchmove ontouchstart
ontransitioncancel ontransitionend ontransitionrun ontransitionstart onunload onvolumechange
onwaiting onwebkitanimationend onwebkitanimationiteration onwebkitanimationstart
onwebkittransitionend onwheel onmozfullscreenchange onafterscriptexecute
onbeforescriptexecute onbeforetoggle oncontentvisibilityautostatechange onscrollend
""".split()

EVENT_CONTEXTS = [
    (r"(?i)<[a-z][^>]*[\s/\"']{ev}\s*=", "{ev} handler in a tag"),
    (r"(?i)[\"'\s/]{ev}\s*=\s*[\"'`]?[^\"'`\s>]*[(`]", "injected {ev} attribute with a call"),
]

XSS_TAGS = """
script iframe frame frameset object embed applet svg math meta base link style form
isindex marquee xml xss bgsound layer ilayer import animate animatetransform set handler
listener image details dialog template portal noscript textarea keygen video audio source
""".split()

XSS_SCHEMES = [
    ("javascript", r"(?i)(?:^|[\s\"'=(<`])j[\s\x00]*a[\s\x00]*v[\s\x00]*a[\s\x00]*s[\s\x00]*c"
                   r"[\s\x00]*r[\s\x00]*i[\s\x00]*p[\s\x00]*t[\s\x00]*:"),
    ("vbscript", r"(?i)(?:^|[\s\"'=(<`])vbscript\s*:"),
    ("livescript", r"(?i)(?:^|[\s\"'=(<`])livescript\s*:"),
    ("mocha", r"(?i)(?:^|[\s\"'=(<`])mocha\s*:"),
    ("data:text/html", r"(?i)\bdata\s*:\s*text/html\b"),
    ("data:application/javascript", r"(?i)\bdata\s*:\s*application/(?:x-)?javascript\b"),
    ("data:image/svg+xml", r"(?i)\bdata\s*:\s*image/svg\+xml\b"),
    ("data: with base64 script", r"(?i)\bdata\s*:[^,]{0,40};base64\s*,\s*PHNjcmlwd"),
]

XSS_SINKS = [
    (r"document\s*\.\s*cookie", "document.cookie"),
    (r"document\s*\.\s*write(?:ln)?\s*\(", "document.write()"),
    (r"document\s*\.\s*domain", "document.domain"),
    (r"window\s*\.\s*location\s*=", "window.location ="),
    (r"document\s*\.\s*location\s*=", "document.location ="),
    (r"\.innerHTML\s*=", "innerHTML ="), (r"\.outerHTML\s*=", "outerHTML ="),
    (r"String\s*\.\s*fromCharCode\s*\(", "String.fromCharCode()"),
    (r"\b(?:alert|prompt|confirm)\s*[(`]", "alert/prompt/confirm"),
    (r"\beval\s*\(\s*(?:atob|unescape|decodeURI|String|location|name|\w+\s*\()", "eval() of decoded data"),
    (r"\bset(?:Timeout|Interval)\s*\(\s*['\"`]", "setTimeout/setInterval with a string"),
    (r"\bnew\s+Function\s*\(", "new Function()"), (r"\bimport\s*\(\s*['\"`]//", "import() from another host"),
    (r"\bfetch\s*\(\s*['\"`]//", "fetch() to another host"),
    (r"\bnavigator\s*\.\s*sendBeacon\s*\(", "navigator.sendBeacon()"),
    (r"\bwindow\s*\[\s*['\"`]\w+['\"`]\s*\]\s*\(", "window['name']()"),
    (r"\btop\s*\[\s*['\"`]\w+['\"`]\s*\]", "top['name']"),
    (r"\bconstructor\s*\.\s*constructor\s*\(", "constructor.constructor()"),
    (r"\bsrcdoc\s*=", "srcdoc ="),
]

XSS_ENCODED = [
    (r"(?i)&#(?:x0*3c|0*60);?\s*[a-z/!?]", "HTML-entity encoded tag"),
    (r"(?i)\\(?:u003c|x3c)\s*[a-z/!?]", "JS-escaped tag"),
    (r"(?i)%3c\s*[a-z/!?]", "doubly URL-encoded tag"),
    (r"(?i)\+ADw-", "UTF-7 encoded tag"),
    (r"(?i)<[a-z]+[^>]*\sstyle\s*=[^>]*(?:expression\s*\(|url\s*\(\s*['\"]?\s*javascript)",
     "script in a style attribute"),
    (r"(?i)-moz-binding\s*:", "XBL binding"),
    (r"(?i)<!\[CDATA\[.*?<", "tag hidden in CDATA"),
]

# --- Path traversal and local files ---------------------------------------

TRAVERSAL = [
    (r"(?:^|[/\\=])\.\.[/\\]", "dot-dot-slash"),
    (r"(?i)(?:%2e%2e|%2e\.|\.%2e)(?:[/\\]|%2f|%5c)", "encoded dot-dot"),
    (r"(?i)\.\.(?:%2f|%5c)", "dot-dot then encoded slash"),
    (r"(?i)(?:%c0%ae|%e0%80%ae|%c0%2e){2}", "overlong UTF-8 dots"),
    (r"(?i)\.\.(?:%c0%af|%c1%9c|%e0%80%af)", "overlong UTF-8 slash"),
    (r"(?i)%25(?:2e|2f|5c)", "double-encoded dot or slash"),
    (r"\.{3,}[/\\]{1,2}", "dot-dot filter evasion"),
    (r"\.\.;[/\\]", "dot-dot-semicolon (path parameter)"),
    (r"(?:[/\\]\.\.){2,}", "repeated slash-dot-dot"),
    (r"\x00", "NUL byte"),
    (r"(?i)(?:^|[/\\])(?:\.\.[/\\])+[^/\\]*(?:[/\\]|$)", "traversal sequence"),
    (r"(?i)[a-z]:\\(?:windows|winnt|boot\.ini|inetpub|users\\)", "Windows absolute path"),
]

SENSITIVE_FILES = """
etc/passwd etc/shadow etc/group etc/gshadow etc/hosts etc/issue etc/hostname etc/crontab
etc/sudoers etc/ssh/sshd_config etc/mysql/my.cnf etc/nginx/nginx.conf etc/apache2/apache2.conf
etc/httpd/conf/httpd.conf etc/php.ini etc/environment etc/profile etc/resolv.conf etc/fstab
etc/motd etc/master.passwd etc/security/passwd etc/inittab etc/exports etc/ldap.conf
proc/self/environ proc/self/cmdline proc/self/fd proc/version proc/cpuinfo proc/self/maps
proc/self/status proc/self/cwd proc/net/tcp proc/mounts
var/log/auth.log var/log/apache2/access.log var/log/apache2/error.log var/log/nginx/access.log
var/log/nginx/error.log var/log/secure var/log/syslog var/log/messages var/log/httpd/access_log
var/run/secrets/kubernetes.io root/.bash_history root/.ssh .ssh/id_rsa .ssh/id_dsa
.ssh/id_ecdsa .ssh/id_ed25519 .ssh/authorized_keys .ssh/known_hosts .bash_history
.mysql_history .psql_history .aws/credentials .docker/config.json .kube/config .npmrc .pypirc
.git-credentials .netrc .pgpass windows/win.ini windows/system.ini boot.ini
windows/system32/drivers/etc/hosts windows/system32/config/sam windows/repair/sam
winnt/repair/sam inetpub/wwwroot/web.config web-inf/web.xml meta-inf/manifest.mf
web-inf/classes .htpasswd .htaccess wp-config.php configuration.php localsettings.php
app/etc/local.xml config/database.yml usr/local/etc/php.ini opt/lampp/etc/httpd.conf
xampp/apache/conf/httpd.conf
""".split()

# --- Command injection -----------------------------------------------------

COMMANDS = """
cat ls id whoami uname wget curl nc ncat netcat bash sh zsh ksh dash python python3 perl ruby
php lua nslookup dig ping telnet ssh scp chmod chown rm mkdir touch echo base64 xxd head tail
find grep awk sed ps kill env printenv ifconfig netstat sleep crontab nohup tftp socat
powershell cmd certutil bitsadmin
""".split()

COMMAND_CONTEXTS = [
    (r";", "after ;"),
    (r"\|\|?", "after a pipe"),
    (r"&&", "after &&"),
    (r"`", "in backquotes"),
    (r"\$\(", "in $( )"),
]

RCE_CORE = [
    (r"(?:^|[;|&`\s(])/(?:usr/)?s?bin/\w+", "absolute path to a binary"),
    (r"\$\{IFS\}|\$IFS\$?\d?", "$IFS space evasion"),
    (r"(?i)\b(?:bash|sh|zsh)\s+-[ic]\b", "shell -c"),
    (r"/dev/(?:tcp|udp)/", "bash /dev/tcp reverse shell"),
    (r"(?i)\bn(?:c|cat)\s+(?:-\w+\s+)*-[ec]\b", "netcat -e"),
    (r"(?i)\bpython[23]?\s+-c\s+['\"]?\s*import\s+(?:socket|os|pty|subprocess)", "python -c import"),
    (r"(?i)\bperl\s+-e\s", "perl -e"),
    (r"(?i)\bphp\s+-r\s", "php -r"),
    (r"(?i)\bruby\s+-e\s", "ruby -e"),
    (r"(?i)\bpowershell(?:\.exe)?\b.{0,60}\s-(?:enc|e|encodedcommand|nop|noprofile|w\s+hidden)\b",
     "powershell with hidden or encoded command"),
    (r"(?i)\bcmd(?:\.exe)?\s+/[ck]\s", "cmd /c"),
    (r"(?i)\bmkfifo\s+/tmp/", "mkfifo reverse shell"),
    (r"(?i)\b(?:wget|curl)\s+[^|;]*\|\s*(?:ba)?sh\b", "download piped to a shell"),
    (r"(?i)\bchmod\s+[+0-7]*[x7]\w*\s+/tmp/", "chmod +x in /tmp"),
    (r"<\?(?:php|=)", "PHP open tag"),
]

PHP_FUNCTIONS = """
system exec shell_exec passthru popen proc_open assert eval create_function preg_replace
include require include_once require_once file_get_contents file_put_contents fopen readfile
unserialize base64_decode phpinfo call_user_func call_user_func_array pcntl_exec
highlight_file show_source
""".split()

# --- Scanners ---------------------------------------------------------------

SCANNERS = """
sqlmap nikto nmap masscan zmap zgrab dirbuster dirb gobuster feroxbuster ffuf wfuzz wpscan
joomscan droopescan acunetix netsparker nessus openvas w3af arachni skipfish burpsuite
burpcollaborator nuclei whatweb havij pangolin jbrofuzz grabber paros webinspect appscan
metasploit commix xsser xsstrike dalfox hydra medusa brutus fimap webshag uniscan bbqsql
nosqlmap jaeles hakrawler gospider crawlergo sqlninja absinthe blackwidow morfeus zmeu
muieblackcat webreaper backdoorbot dotdotpwn wapiti vega owasp-zap zaproxy httprint
qualys censysinspect expanse l9explore leakix netsystemsresearch
""".split() + ["nmap scripting engine"]

# --- Remote files and stream wrappers ----------------------------------------

WRAPPERS = """
php://input php://filter php://memory php://temp php://fd php://stdin expect:// zip://
phar:// data:// glob:// file:// gopher:// dict:// ldap:// ldaps:// jar: netdoc: ogg://
rar:// ssh2:// compress.zlib:// compress.bzip2:// tftp://
""".split()

# --- Probes for files and consoles that should not be served ------------------

PROBE_PATHS = """
.git/ .svn/ .hg/ .bzr/ .DS_Store .env .htaccess .htpasswd .idea/ .vscode/ .aws/ .ssh/
.npmrc .dockerenv .travis.yml .gitlab-ci.yml phpmyadmin pma/ myadmin mysqladmin adminer.php
phpinfo.php info.php test.php server-status server-info shell.php c99.php r57.php wso.php
webshell cmd.jsp cmd.asp jmx-console web-console manager/html invoker/JMXInvokerServlet
solr/admin console/login _profiler telescope _ignition/execute-solution
vendor/phpunit/phpunit/src/Util/PHP/eval-stdin.php HNAP1 boaform setup.cgi GponForm
cgi-bin/test-cgi cgi-bin/php cgi-bin/bash wp-admin/install.php wp-content/debug.log
xmlrpc.php elmah.axd trace.axd web.config actuator/env actuator/heapdump actuator/jolokia
actuator/gateway/routes actuator/logfile actuator/threaddump jolokia/ druid/index.html
swagger-resources/configuration/ui .well-known/acme-challenge/../ owa/auth/x.js
autodiscover/autodiscover.json ecp/ remote/fgt_lang dana-na/ vpn/../vpns/ cgi-bin/luci
api/v1/pods containers/json debug/pprof/ storage/logs/laravel.log config.json.bak
""".split()

BACKUP_TARGETS = """
wp-config.php config.php settings.php configuration.php web.config .env database.yml
config.inc.php LocalSettings.php app.config
""".split()

BACKUP_SUFFIXES = [".bak", ".old", ".orig", ".save", ".swp", "~", ".txt", ".dist", ".backup", ".1"]

# --- Everything else ------------------------------------------------------------

JNDI_PROTOCOLS = "ldap ldaps rmi dns nis iiop corba nds http https".split()

SSTI_KEYWORDS = """
__class__ __mro__ __subclasses__ __globals__ __builtins__ __init__ __import__ config
self._TemplateReference request.application lipsum cycler joiner namespace
""".split()

SSRF_HOSTS = [
    (r"169\.254\.169\.254", "cloud metadata"), (r"metadata\.google\.internal", "GCP metadata"),
    (r"100\.100\.100\.200", "Alibaba metadata"), (r"\[?::1?\]?", "IPv6 loopback"),
    (r"127\.\d+\.\d+\.\d+", "loopback"), (r"localhost", "localhost"), (r"0\.0\.0\.0", "0.0.0.0"),
    (r"0x7f[0-9a-f]*", "hex loopback"), (r"2130706433", "decimal loopback"),
    (r"\[?::ffff:127\.0\.0\.1\]?", "IPv4-mapped loopback"), (r"instance-data", "EC2 instance-data"),
]

NOSQL_OPERATORS = "ne gt lt gte lte regex where exists in nin or and expr elemMatch".split()

MISC = [
    (r"(?i)\$\{\s*(?:\$\{[^}]{0,30}\}|[^}]){0,40}j(?:\$\{[^}]{0,30}\}|[^}]){0,10}n"
     r"(?:\$\{[^}]{0,30}\}|[^}]){0,10}d(?:\$\{[^}]{0,30}\}|[^}]){0,10}i", "obfuscated JNDI lookup",
     ["uri", "args", "body", "headers"]),
    (r"(?i)\$\{(?:lower|upper|env|sys|java|date|main|bundle|ctx|docker|k8s|log4j|spring|web):",
     "Log4j lookup", ["uri", "args", "body", "headers"]),
    (r"\{\{\s*\d+\s*\*\s*\d+\s*\}\}", "template arithmetic probe {{7*7}}", INPUT),
    (r"\$\{\s*\d+\s*\*\s*\d+\s*\}", "template arithmetic probe ${7*7}", INPUT),
    (r"<%=?\s*\d+\s*\*\s*\d+\s*%>", "template arithmetic probe <%= 7*7 %>", INPUT),
    (r"#\{\s*\d+\s*\*\s*\d+\s*\}", "template arithmetic probe #{7*7}", INPUT),
    (r"(?i)\$\{\s*T\s*\(\s*java\.lang\.", "Spring EL type reference", INPUT),
    (r"(?i)freemarker\.template\.utility\.Execute", "FreeMarker Execute", INPUT),
    (r"(?i)\bclass\.module\.classLoader\b", "Spring4Shell class loader access", INPUT),
    (r"%\{\s*[#(@]", "OGNL expression", ["uri", "args", "body", "headers"]),
    (r"(?i)@java\.lang\.Runtime@getRuntime", "OGNL Runtime access", INPUT),
    (r"(?i)\bjava\.lang\.(?:Runtime|ProcessBuilder)\b", "Java process API", INPUT),
    (r"rO0AB[A-Za-z0-9+/]", "base64 Java serialized object", INPUT),
    (r"(?i)\baced0005", "hex Java serialized object", INPUT),
    (r"(?i)O:\d+:\"[a-z_\\]+\":\d+:\{", "PHP serialized object", INPUT),
    (r"(?i)<!ENTITY\s+[^>]*\bSYSTEM\b", "XXE external entity", ["body"]),
    (r"(?i)<!DOCTYPE\s+[^>]*\[", "DOCTYPE with internal subset", ["body"]),
    (r"(?i)<!ENTITY\s+%", "XXE parameter entity", ["body"]),
    (r"(?i)<xi:include\b", "XInclude", ["body"]),
    (r"\*\)\s*\(\s*[|&]", "LDAP filter injection", INPUT),
    (r"\)\s*\(\s*\|\s*\(", "LDAP OR injection", INPUT),
    (r"\(\s*\)\s*\{\s*:\s*;\s*\}\s*;", "Shellshock", ["headers", "args", "body"]),
]

CRLF_HEADERS = "set-cookie location content-type content-length refresh x-xss-protection".split()


def main():
    for pattern, msg in SQLI_CORE:
        rule("sqli", pattern, "SQL injection: " + msg)
    for pattern, msg in SQL_FUNCTION_CONTEXTS:
        for fn in SQL_FUNCTIONS:
            rule("sqli", pattern.format(fn=word(fn)), "SQL injection: " + msg.format(fn=fn))
    for pattern, after in SQL_STACK_CONTEXTS:
        for st, name in SQL_STATEMENTS:
            rule("sqli", pattern.format(st=st), f"SQL injection: stacked {name} after a {after}")

    for pattern, msg in EVENT_CONTEXTS:
        for ev in EVENT_HANDLERS:
            rule("xss", pattern.format(ev=ev), "XSS: " + msg.format(ev=ev))
    for tag in XSS_TAGS:
        rule("xss", rf"(?i)<\s*/?\s*{tag}\b", f"XSS: <{tag}> tag")
    for name, pattern in XSS_SCHEMES:
        rule("xss", pattern, f"XSS: {name} URL")
    for sink, name in XSS_SINKS:
        rule("xss", "(?i)" + sink, "XSS: script sink " + name)
    for pattern, msg in XSS_ENCODED:
        rule("xss", pattern, "XSS: " + msg)

    for pattern, msg in TRAVERSAL:
        rule("traversal", pattern, "path traversal: " + msg, PATHISH)
    for f in SENSITIVE_FILES:
        path = r"[/\\]+".join(word(part) for part in f.split("/"))
        rule("traversal", rf"(?i)(?:^|[/\\=:]){path}(?:$|[/\\?#&;\s\x00])", f"local file: {f}", PATHISH)
        rule("traversal", rf"(?i)\.\.[/\\]+(?:[^/\\]*[/\\]+)*?{path}", f"traversal to {f}", PATHISH)

    for pattern, msg in RCE_CORE:
        rule("rce", pattern, "command injection: " + msg)
    for ctx, where in COMMAND_CONTEXTS:
        for cmd in COMMANDS:
            rule("rce", rf"(?i){ctx}\s*{word(cmd)}(?:\s+[-/.~$'\"]|\s*(?:$|[;|&`)]))",
                 f"command injection: {cmd} {where}")
    for fn in PHP_FUNCTIONS:
        rule("rce", rf"(?i)\b{fn}\s*\(\s*[$'\"]", f"PHP code injection: {fn}()")

    for name in SCANNERS:
        rule("scanner", rf"(?i)\b{word(name)}\b", f"scanner user agent: {name}", ["user_agent"])
    rule("scanner", r"(?i)^(?:-|\s*)$", "empty user agent", ["user_agent"])
    rule("scanner", r"(?i)\(\s*\)\s*\{", "function definition in user agent", ["user_agent"])

    for w in WRAPPERS:
        rule("rfi", rf"(?i)(?:^|[\s=\"'(]){word(w)}", f"stream wrapper {w}", PATHISH)
    rule("rfi", r"(?i)^(?:https?|ftps?)://[^?#]+\?+$", "remote file with trailing ?", ["args"])
    rule("rfi", r"(?i)^(?:https?|ftps?)://\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?/[^?]*\.(?:txt|php|inc|jpg|gif)\b",
         "remote include from a bare IP", ["args"])

    for p in PROBE_PATHS:
        rule("probe", rf"(?i)/{word(p)}", f"probe for {p}", ["uri"])
    for f in BACKUP_TARGETS:
        for s in BACKUP_SUFFIXES:
            rule("probe", rf"(?i)/{word(f + s)}$", f"probe for backup {f}{s}", ["uri"])

    for pattern, msg, targets in MISC:
        rule("misc", pattern, msg, targets)
    for proto in JNDI_PROTOCOLS:
        rule("misc", rf"(?i)\$\{{\s*jndi\s*:\s*{proto}\s*:", f"Log4Shell JNDI {proto} lookup",
             ["uri", "args", "body", "headers"])
    for k in SSTI_KEYWORDS:
        rule("misc", rf"\{{\{{[^}}]{{0,80}}{word(k)}", f"template injection: {k}", INPUT)
    for host, name in SSRF_HOSTS:
        rule("misc", rf"(?i)\b(?:https?|gopher|dict|ftp)://(?:[^/@]*@)?{host}(?:[:/]|$)",
             f"SSRF to {name}", INPUT)
    for op in NOSQL_OPERATORS:
        rule("misc", rf"\[\s*\${op}\s*\]", f"NoSQL operator [${op}] in a parameter", INPUT)
        rule("misc", rf"[\"']\${op}[\"']\s*:", f"NoSQL operator \"${op}\" in JSON", ["body"])
    for h in CRLF_HEADERS:
        rule("misc", rf"(?i)[\r\n]\s*{h}\s*:", f"CRLF injection of {h}", ["uri", "args"])

    print_lua()


def lua_long(s):
    """s as a Lua long string with a level that does not occur in it."""
    level = 0
    while "]" + "=" * level + "]" in s + "]":
        level += 1
    eq = "=" * level
    # A newline right after the opening bracket would be dropped by Lua.
    assert not s.startswith("\n")
    return f"[{eq}[{s}]{eq}]"


def lua_string(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def print_lua():
    print("-- Rules of the example WAF (waf.lua), generated by gen_waf_rules.py; see")
    print("-- there for the families and the targets. Patterns are for")
    print('-- ngx.re.find(subject, pattern, "jo").')
    print(f"-- {len(rules)} rules.")
    print("return {")
    for id_, pattern, targets, msg in rules:
        t = ", ".join(lua_string(x) for x in targets)
        print(f"{{ id = {id_}, pattern = {lua_long(pattern)}, targets = {{ {t} }},")
        print(f"  msg = {lua_string(msg)} }},")
    print("}")


main()
