// Mtp.g4 — the grammar of .mtp specs (docs/language.md is the reference).
//
// The grammar is deliberately permissive about *what* a block contains: any
// `key = value` entry parses, and Sema decides which keys exist, their types
// and ranges, so that a misspelt key gets "did you mean ...?" instead of a
// syntax error. Only the shapes of model, backbone, task and correlate are
// fixed here.
grammar Mtp;

spec        : model EOF ;

model       : MODEL name=ident LBRACE item* RBRACE ;

item        : backbone
            | task
            | correlate
            | section
            ;

// backbone transformer { layers = 24  hidden = 1024 ... }
// backbone pretrained("models/gpt2") { seq = 256 }
backbone    : BACKBONE (source=call | kind=ident) block? ;

// task mnli : classify(classes = 3) from pooled loss cross_entropy weight 1.0
task        : TASK name=ident COLON head=call taskClause* ;

taskClause  : FROM tap                          # fromClause
            | LOSS loss=ident                   # lossClause
            | WEIGHT number                     # weightClause
            ;

tap         : POOLED (LAYER layer=number)?      # pooledTap
            | LAYER (layer=number | span=range) # layerTap
            | EMBEDDINGS                        # embeddingsTap
            ;

// correlate pos ~ chunk = 0.8
correlate   : CORRELATE a=ident TILDE b=ident ASSIGN number ;

// budget { ... }, strategy { ... }, train { ... }
section     : name=ident block ;

block       : LBRACE entry* RBRACE ;

entry       : key=ident ASSIGN value COMMA? ;

value       : number unit?                      # numberValue
            | range                             # rangeValue
            | STRING                            # stringValue
            | call block?                       # callValue
            | ident block?                      # identValue
            | block                             # blockValue
            ;

call        : name=ident LPAREN (arg (COMMA arg)*)? RPAREN ;

arg         : (key=ident ASSIGN)? value ;

// 32GiB, 1.2 ms, 25 GB/s
unit        : ident (SLASH ident)? ;

number      : (PLUS | MINUS)? NUMBER ;

// A search range (mtpc search): 4..12, 64..512 by 64.
range       : RANGE (BY step=NUMBER)? ;

// Keywords stay usable as names and keys.
ident       : ID | MODEL | BACKBONE | TASK | CORRELATE | FROM | LOSS | WEIGHT
            | POOLED | LAYER | EMBEDDINGS | BY ;

MODEL       : 'model' ;
BACKBONE    : 'backbone' ;
TASK        : 'task' ;
CORRELATE   : 'correlate' ;
FROM        : 'from' ;
LOSS        : 'loss' ;
WEIGHT      : 'weight' ;
POOLED      : 'pooled' ;
LAYER       : 'layer' ;
EMBEDDINGS  : 'embeddings' ;
BY          : 'by' ;

LBRACE      : '{' ;
RBRACE      : '}' ;
LPAREN      : '(' ;
RPAREN      : ')' ;
COMMA       : ',' ;
COLON       : ':' ;
ASSIGN      : '=' ;
TILDE       : '~' ;
SLASH       : '/' ;
PLUS        : '+' ;
MINUS       : '-' ;

// 4..12: longer than the NUMBER "4." it starts with, so it wins.
RANGE       : DIGITS '..' DIGITS ;

// 7, 1_000, 0.30, .5, 3e-4, 1.2E+3
NUMBER      : DIGITS ('.' DIGITS?)? EXPONENT?
            | '.' DIGITS EXPONENT?
            ;
fragment DIGITS   : [0-9] ('_'? [0-9])* ;
fragment EXPONENT : [eE] [+-]? [0-9]+ ;

ID          : [a-zA-Z_] [a-zA-Z_0-9]* ;

STRING      : '"' (~["\\\r\n] | '\\' ~[\r\n])* '"' ;
// A string that reaches the end of its line: reported as unterminated.
UNTERMINATED_STRING : '"' (~["\\\r\n] | '\\' ~[\r\n])* ;

LINE_COMMENT  : ('#' | '//') ~[\r\n]* -> skip ;
BLOCK_COMMENT : '/*' .*? '*/' -> skip ;
// An unclosed /* comment: reported as such, not as stray characters.
UNTERMINATED_COMMENT : '/*' (~'*' | '*'+ ~[*/])* '*'* EOF ;
WS          : [ \t\r\n]+ -> skip ;

// Anything else reaches the parser as one token it reports precisely.
STRAY       : . ;
